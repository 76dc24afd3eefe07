#!/usr/bin/env bash
# Choosing r and gamma by fidelity (issue 8, `ripplekv tune`), SmolLM2-135M with the default profile.
# Prompts: the 59 held-out LongBench-E records of ../analyze-smollm2 (records 16-20 of 12 tasks, 2,048 tokens,
# question-aware); each task's first prompts (--calibration-fraction 0.5) select, the rest are held out.
# Grid: r in 1.5,2,3,4,6,8 x gamma in 1.5,2,3,5 (the defaults r=4, gamma=3 are in it), at 10/20/30%.
# Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv tune --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e \
  --skip 15 --limit 5 --max-length 2048 --budgets 0.1,0.2,0.3 \
  --profile default=benchmarks/results/smollm2-135m.profile.json \
  --ratios 1.5,2,3,4,6,8 --gammas 1.5,2,3,5 --no-progress --out benchmarks/results/tune-smollm2 "$@"
