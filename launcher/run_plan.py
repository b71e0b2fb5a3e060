"""What every rank of a planned run executes: `python -m meshplan.launcher.run_plan --plan PLAN [--run-dir DIR]
[--steps N] [--device cpu|cuda]`, under torchrun (the scripts `meshplan export` writes and `meshplan launch`).

It reads the plan with the planner, maps it onto the training core's RunConfig (launcher/plan_run.py: the
parallel names are torchtitan's on both sides) and runs the core with it; the core itself
(`python -m meshplan.launcher.core.train --config RUN.yaml`) never reads plan files.
"""

from __future__ import annotations

import argparse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m meshplan.launcher.run_plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", required=True, help="a meshplan plan file (what `meshplan launch` passes)")
    ap.add_argument("--run-dir", help="override the plan's run directory")
    ap.add_argument("--steps", type=int, help="override the plan's steps")
    ap.add_argument("--device", choices=("cpu", "cuda"), help="override the device")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def config():
        from meshplan.launcher.core.config import RunConfig
        from meshplan.launcher.plan_run import run_config_fields
        from meshplan.planner.plan_file import core_refusal, load_plan

        plan = load_plan(args.plan)
        why = core_refusal(plan)
        if why:
            raise ValueError(why)
        return RunConfig.from_dict(run_config_fields(plan, args.run_dir, args.steps, args.device))

    from meshplan.launcher.core.train import main as train

    return train(config=config)


if __name__ == "__main__":
    from meshplan.launcher.core.train import exit_without_teardown

    exit_without_teardown(main())
