"""Token Recycling Studio: chat with a small LLM decoded by Token Recycling and watch every step, live.

Run `python app.py` and open http://127.0.0.1:7860. Hosting for others: `python app.py --public` (implied by
--share, by a --host other than loopback and by Hugging Face Spaces) lets visitors choose only among the
models listed with --models, caps answers at --time-limit seconds and slow motion at --max-delay.
This file parses arguments, preloads the default model and launches; the app itself is the `studio` package.
"""
from __future__ import annotations

import argparse
import os
import threading

from studio import zerogpu

zerogpu.import_spaces()  # on ZeroGPU, `spaces` must come before torch (it patches torch's CUDA on import)

from studio.config import EMBEDDED, make_config, parse_models, wants_public  # noqa: E402
from studio.handlers import WARMING, new_engine, share_costs  # noqa: E402
from studio.models import ModelCatalog  # noqa: E402
from studio.page import CHAT_CONCURRENCY, CSS, build_demo  # noqa: E402
from studio.session import Studio, decode_slot  # noqa: E402
from tr_core.cli.options import apply_threads, threads_option  # noqa: E402

MODEL_ENV = "TR_MODEL"  # environment variable naming the default model (hub id, folder or .gguf); empty = embedded


def default_template() -> str:
    """$TR_TEMPLATE, else the benchmark winner on the device: the paper's tree on a GPU, the hybrid tree on a CPU."""
    import torch

    from tr_core.tree import default_template as for_device

    on_gpu = zerogpu.on_zerogpu() or torch.cuda.is_available()  # ZeroGPU: the app has no GPU, its decoding does
    return os.environ.get("TR_TEMPLATE") or for_device("cuda" if on_gpu else "cpu")


def preload(studio: Studio) -> None:
    """Load the default model, learn (or load) its warm start, and run each decoding kind once, so first answers
    carry no one-time costs; all but the load hold the decode slot (answers wait for `studio.warm`). On ZeroGPU
    only the model is loaded (the GPU exists only inside a decorated call: the first answer does its first forward
    there)."""
    try:
        from tr_core.config import DecodeConfig

        name = studio.config.default_model
        if zerogpu.on_zerogpu():
            studio.catalog.get(name)  # loaded before the GPU workers fork, so they inherit it
            return
        engine = new_engine(studio, name, 8, progress=lambda i, n: _show_progress(studio, i, n))  # holds the slot
        ids = engine.encode_chat([{"role": "user", "content": "Say hello."}])
        with decode_slot():  # the first forwards, the CPU's kernel tuning and the cost probe time the machine alone
            for cfg in (DecodeConfig(max_new_tokens=8, template=studio.default_template, provenance=True),  # as answers
                        DecodeConfig(max_new_tokens=8, plain=True)):
                for _ in engine.generate(ids, cfg):
                    pass
        share_costs(studio, name, engine)  # the forward costs it timed serve every session (when timed steadily)
    except Exception as exc:  # noqa: BLE001 - the first message will show the error in the page
        print(f"could not preload the model: {type(exc).__name__}: {exc}")
    finally:
        studio.preparing = ""
        studio.warm.set()


def _show_progress(studio: Studio, done: int, total: int) -> None:
    """The preload's warm-start learning (once per model and machine; then cached): on the page of every visitor
    waiting for it, and on the console."""
    studio.preparing = WARMING.format(done, total)
    if done == total or done % max(total // 10, 1) == 0:
        print(f"learning a warm start for the default model: {done} of {total}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Token Recycling Studio (Gradio app)")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--model", default=os.environ.get(MODEL_ENV) or None,
                        help=f"default model (else ${MODEL_ENV}, else the embedded SmolLM2-135M)")
    parser.add_argument("--models", default=os.environ.get("TR_MODELS"), metavar="ID1,ID2",
                        help="the models visitors may choose in public mode (default: the default model alone)")
    parser.add_argument("--public", action="store_true",
                        help="public mode (implied by --share, a non-loopback --host and SPACE_ID): listed models only, "
                             "time limit per answer, capped slow motion")
    parser.add_argument("--share", action="store_true", help="create a public gradio.live link (implies --public)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="S",
                        help="seconds per answer (default: 120 in public mode, none otherwise; 0 = none)")
    parser.add_argument("--max-delay", type=float, default=None, metavar="S",
                        help="longest slow-motion pause per step (default: 0.5 in public mode, 3 otherwise)")
    parser.add_argument("--template", default=None,
                        help="default draft tree template on the page (else $TR_TEMPLATE; else 2.2.2 on GPU, hybrid on CPU)")
    parser.add_argument("--no-preload", action="store_true", help="load the model on the first message, not at start")
    threads_option(parser, default=int(os.environ.get("TR_THREADS", 0)) or None,
                   help="CPU threads for torch (default: torch's choice, or $TR_THREADS); 1 is steadier on a busy "
                        "small machine")
    return parser.parse_args(argv)


def make_studio(args: argparse.Namespace) -> Studio:
    """The studio instance these arguments describe."""
    public = wants_public(args.public, args.share, args.host)
    config = make_config(public, parse_models(args.models, args.model or EMBEDDED), args.time_limit, args.max_delay)
    if args.template:
        os.environ["TR_TEMPLATE"] = args.template
    return Studio(config=config, catalog=ModelCatalog(config), default_template=default_template())


def main(argv: list[str] | None = None) -> None:
    import gradio as gr

    args = parse_args(argv)
    apply_threads(args.threads)
    studio = make_studio(args)
    cfg = studio.config
    print(f"Token Recycling Studio: {'PUBLIC' if cfg.public else 'private'} mode; models: {', '.join(cfg.models)}; "
          f"time limit per answer: {cfg.time_limit_s or 'none'}")
    if zerogpu.install(studio.catalog):
        print(f"ZeroGPU: answers and speed measurements run in spaces.GPU calls of at most {zerogpu.max_duration()} s")
    if not args.no_preload:  # load the default model while the page opens, not on the first click
        studio.warm.clear()
        threading.Thread(target=preload, args=(studio,), daemon=True, name="tr-preload").start()
    demo = build_demo(studio)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, css=CSS,
                max_file_size=f"{int(cfg.max_upload_mb)}mb", max_threads=CHAT_CONCURRENCY + 40,
                theme=gr.themes.Soft(primary_hue="green", secondary_hue="blue"))


if __name__ == "__main__":
    main()
