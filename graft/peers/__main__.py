"""python -m graft.peers vllm [overrides ...] --out RUN_DIR [--python PY] [--methods ...] [--k 4] [--batch-sizes ...]

graft/peers/vllm_runner.py says what it runs and writes; docs/peers.md what its rows mean beside this harness's."""

from __future__ import annotations

import argparse
from pathlib import Path

from graft.run.commands import one_line_errors


@one_line_errors  # bad input is one line and exit 2, as in run.py
def main(argv: list[str] | None = None) -> None:
    from graft.peers import vllm_runner as vllm

    parser = argparse.ArgumentParser(
        prog="python -m graft.peers", description=vllm.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("engine", choices=("vllm",))
    parser.add_argument("overrides", nargs="*", help="run.py's overrides: model=, dataset=, run.num_prompts=, ...")
    parser.add_argument("--out", type=Path, required=True, metavar="RUN_DIR", help="a new (or empty) folder")
    parser.add_argument("--python", type=Path, default=Path(".peers/vllm/bin/python"), help="vLLM's environment")
    parser.add_argument("--methods", default="ar,ngram,eagle3,dflash", help=f"of {', '.join(vllm.PEER_METHODS)}")
    parser.add_argument("--k", type=int, default=4, help="speculative tokens a step (ngram, suffix, eagle3)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--batch-sizes", default="", help="also vLLM's AR throughput at these batch sizes (1,8,32)")
    args = parser.parse_args(argv)
    from graft.bench import batch_sizes
    from graft.config.experiment import validate
    from graft.config.override_checks import compose_checked

    cfg = validate(compose_checked(["logger=none", *args.overrides]))
    plan, chat, prompts = vllm.plan_peer(
        cfg, python=args.python, methods=vllm.parse_methods(args.methods), k=args.k, dtype=args.dtype,
        max_model_len=args.max_model_len,
    )  # fmt: skip
    sizes = batch_sizes(args.batch_sizes, least=1, example="1,8,32", flag="--batch-sizes") if args.batch_sizes else []
    out = vllm.run_peer(cfg, plan, chat, prompts, out=args.out, batch_sizes=sizes)
    print(out)


if __name__ == "__main__":
    main()
