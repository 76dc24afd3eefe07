"""``ripplekv allocate``: per-layer token budgets of one schedule, or of every schedule side by side."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ripplekv.cli.args import add_budget_args, load_profile, positive_int, resolve_budget

COMPARED = ("uniform", "pyramidkv", "ripplekv", "ripplekv-local")  # method names, but uniform (snapkv's)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``allocate`` subcommand to ``subparsers``; return its parser."""
    from ripplekv.presses.registry import DEFAULT_WINDOW

    a = subparsers.add_parser(
        "allocate",
        help="per-layer token budgets: RippleKV from a profile, PyramidKV or uniform (SnapKV)",
        description="Per-layer token budgets of one schedule (--schedule), or of every schedule side by side "
        "(--compare). ripplekv: min-max normalise the profile's scores, w_l = ratio ** s_l, clip to "
        "[1/gamma, gamma], rescale so the per-layer budgets sum to layers x budget (r and gamma: --ratio and "
        "--gamma if given, else the profile's chosen setting, else 4 and 3; printed with where they came from); "
        "ripplekv-local: the same on "
        "the profile's local signal; pyramidkv: PyramidKV's linear schedule (authors' code) rescaled to that "
        "total; uniform: SnapKV, the same count in every layer.",
    )
    a.add_argument(
        "--profile", default=None, help="profile JSON from `ripplekv profile` (needed by the ripplekv schedules)"
    )
    a.add_argument(
        "--schedule",
        choices=("ripplekv", "ripplekv-local", "pyramidkv", "uniform"),
        default="ripplekv",
        help="budget schedule (default ripplekv)",
    )
    a.add_argument("--compare", action="store_true", help="one table of every schedule (ripplekv ones need --profile)")
    a.add_argument(
        "--layers", type=positive_int, default=None, help="number of layers for pyramidkv/uniform without --profile"
    )
    a.add_argument("--window-size", type=positive_int, default=DEFAULT_WINDOW, help="PyramidKV window W (default 64)")
    add_budget_args(a)
    a.add_argument("--prompt-tokens", type=positive_int, required=True, help="prompt length in tokens")
    a.add_argument(
        "--ratio",
        type=float,
        default=None,
        help="disparity r (default: the profile's chosen setting, else 4; giving --ratio or --gamma sets both, the "
        "other at its default)",
    )
    a.add_argument(
        "--gamma", type=float, default=None, help="clip bound (default: the profile's chosen setting, else 3)"
    )
    a.add_argument(
        "--min-tokens",
        type=positive_int,
        default=None,
        help="smallest layer budget (default: the selection window, --window-size)",
    )
    a.add_argument("--signal", choices=("kl", "local"), default="kl", help="profile signal (default kl)")
    a.add_argument("--json", action="store_true", help="print JSON; its `budgets` is the per-layer token list")
    a.add_argument("--plot", default=None, help="save a PNG of the scores and budgets")
    return a


def run(args: argparse.Namespace) -> int:
    """Run ``ripplekv allocate`` with parsed ``args``: print the budgets table (or JSON); return the exit status."""
    from ripplekv.allocation.budget import AllocationConfig, BudgetSpec, ProfileSchedule, allocate
    from ripplekv.allocation.schedules import PyramidSchedule, UniformSchedule
    from ripplekv.presses.method_spec import needs_profile
    from ripplekv.profiling.profile import resolve_setting

    profile = load_profile(args.profile, required=bool(needs_profile(args.schedule)) and not args.compare)
    if profile is None and args.layers is None:
        raise SystemExit("error: give --profile (or --layers N for the pyramidkv and uniform schedules)")
    if profile is not None and args.layers is not None and args.layers != profile.num_layers:
        raise SystemExit(f"error: --layers {args.layers} but the profile has {profile.num_layers} layers")
    if args.plot and profile is None:
        raise SystemExit("error: --plot draws the profile's scores: give --profile")
    n_layers = profile.num_layers if profile is not None else args.layers
    given = resolve_budget(args)  # {"budget": F} or {"tokens": N}
    spec = BudgetSpec(**given)
    floor = args.window_size if args.min_tokens is None else args.min_tokens  # what make_press's presses use
    try:
        setting = resolve_setting(profile, args.ratio, args.gamma)  # what make_press's RippleKV presses use
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None

    def signal_scores(name: str) -> tuple[float, ...]:
        if profile is None:
            raise SystemExit(f"error: the {name} schedule needs --profile")
        local = name == "ripplekv-local" or args.signal == "local"
        return tuple(profile.local_scores if local else profile.scores)

    def budgets_of(name: str) -> tuple[int, ...]:
        if name == "uniform":
            schedule: Any = UniformSchedule(**given)
        elif name == "pyramidkv":
            schedule = PyramidSchedule(**given, window_size=args.window_size)
        else:
            schedule = ProfileSchedule(**given, scores=signal_scores(name), ratio=setting.ratio, gamma=setting.gamma)
        return schedule.layer_budgets(n_layers, args.prompt_tokens, floor)

    names = [s for s in COMPARED if profile or not needs_profile(s)] if args.compare else [args.schedule]
    table = {name: budgets_of(name) for name in names}
    average = spec.average(args.prompt_tokens)
    shown = str(spec.budget) if spec.tokens is None else f"{spec.tokens} token{'s' * (spec.tokens != 1)} per layer"
    budget_json = {"budget": spec.budget, "tokens": spec.tokens}
    if args.plot:
        from ripplekv.cli.plots import plot_profile_and_budgets

        plotted = dict(table) if args.compare else {args.schedule: table[args.schedule]}
        plotted.setdefault("uniform", budgets_of("uniform"))
        plot_profile_and_budgets(
            signal_scores("ripplekv"),
            {("uniform (snapkv)" if name == "uniform" else name): values for name, values in plotted.items()},
            args.plot,
            title=f"{profile.model['name_or_path']}: budget {shown} of {args.prompt_tokens} tokens",
        )
    header = f"{n_layers} layers, budget {shown} of {args.prompt_tokens} prompt tokens: "
    header += f"{average} tokens per layer on average, {average * n_layers} in all"
    ripple_shown = bool(needs_profile(args.schedule)) or (args.compare and profile is not None)
    setting_line = f"ripplekv setting: {setting.describe()}"
    if setting.source == "profile":
        setting_line += f"; chosen by `ripplekv profile`: {profile.setting.describe()}"  # type: ignore[union-attr]
    elif setting.source == "default" and profile is not None:
        setting_line += "; the profile records no setting (made before settings existed, or --no-select-setting)"
    setting_json = {"ratio": setting.ratio, "gamma": setting.gamma, "setting_source": setting.source}
    if needs_profile(args.schedule) and not args.compare:
        scores = signal_scores(args.schedule)
        config = AllocationConfig(ratio=setting.ratio, gamma=setting.gamma)
        allocation = allocate(scores, args.prompt_tokens, floor, **given, config=config)
        if args.json:
            extra = {**setting_json, **budget_json, "schedule": args.schedule}
            print(json.dumps({**allocation.to_dict(), **extra}))
            return 0
        print(header)
        print(setting_line)
        print("layer     score  norm  weight  tokens")
        for i in range(len(scores)):
            print(
                f"{i:5d}  {allocation.scores[i]:8.5f}  {allocation.normalized[i]:4.2f}  "
                f"{allocation.weights[i]:6.3f}  {allocation.budgets[i]:6d}"
            )
    elif args.json:
        common = {**budget_json, "prompt_tokens": args.prompt_tokens, "average_budget": average}
        common["total"] = average * n_layers
        if ripple_shown:
            common.update(setting_json)
        if args.compare:
            print(json.dumps({**common, "budgets": {name: list(values) for name, values in table.items()}}))
        else:
            print(json.dumps({**common, "schedule": args.schedule, "budgets": list(table[args.schedule])}))
        return 0
    else:
        print(header)
        if ripple_shown:
            print(setting_line)
        print("layer  " + "  ".join(f"{name:>14}" for name in table))
        for i in range(n_layers):
            print(f"{i:5d}  " + "  ".join(f"{values[i]:14d}" for values in table.values()))
        if args.compare:
            print("total  " + "  ".join(f"{sum(values):14d}" for values in table.values()))
    if args.plot:
        print(f"plot saved to {args.plot}")
    return 0
