"""Question-answer calibration data for ``ripplekv profile --calib FILE --continuation model``.

Writes a JSONL file of ``{"context", "question", "continuation"}`` records from LongBench-E question-answering
files, taking only records from index ``--first`` on (the LongBench runs in benchmarks/results use records 0-14 for
evaluation and 15-19 for the held-out analysis, so the default 20 keeps calibration disjoint from both). Records
are interleaved round-robin across tasks, so a profile's first ``--samples N`` cover the tasks evenly. Each context
is middle-truncated to ``--chars`` characters (head and tail kept, as LongBench truncates), about 2,000 tokens at
the default; ``question`` is ``"\\n\\nQuestion: <input>\\nAnswer:"`` and ``continuation`` the gold answer (used only
with ``--continuation text``); ``answers`` makes the same file a ``--suite jsonl`` data file (for
``ripplekv analyze``: the damage of compressing each layer alone, measured on calibration prompts, is the
compression-shaped perturbation).

    python benchmarks/make_qa_calibration.py ../shared/data/longbench benchmarks/results/profiles/calib-qa.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASKS = "2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,triviaqa_e,passage_retrieval_en_e"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_dir", type=Path, help="folder of LongBench <task>.jsonl files")
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    parser.add_argument("--tasks", default=TASKS, help=f"comma-separated (default {TASKS})")
    parser.add_argument("--first", type=int, default=20, help="first record index used in each file (default 20)")
    parser.add_argument("--chars", type=int, default=8000, help="context length in characters (default 8000)")
    args = parser.parse_args()
    per_task = []
    for task in args.tasks.split(","):
        lines = (args.data_dir / f"{task}.jsonl").read_text(encoding="utf-8").split("\n")
        records = [json.loads(line) for line in lines if line.strip()][args.first :]
        per_task.append([(task, args.first + i, r) for i, r in enumerate(records) if r["input"] and r["answers"]])
    out = []
    for rank in range(max(len(t) for t in per_task)):
        for records in per_task:
            if rank < len(records):
                task, index, record = records[rank]
                context = record["context"]
                if len(context) > args.chars:
                    half = args.chars // 2
                    context = context[:half] + context[-half:]
                question = "\n\nQuestion: " + record["input"] + "\nAnswer:"
                out.append(
                    {
                        "context": context,
                        "question": question,
                        "continuation": question + " " + record["answers"][0],
                        "answers": record["answers"],
                        "source": f"{task}:{index}",
                    }
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in out), encoding="utf-8")
    print(f"{len(out)} records -> {args.out}")


if __name__ == "__main__":
    main()
