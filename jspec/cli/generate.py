"""python -m jspec.generate: generate text with speculative decoding over an OSCAR INT2 KV cache.

    python -m jspec.generate "def fibonacci(n):"                 # the shipped pair, INT2 OSCAR cache
    python -m jspec.generate --model DIR --draft none --kv bf16 --json "Hello"
    python -m jspec.generate --input in.jsonl --output out.jsonl --batch-size 16
    python -m jspec.generate --input in.jsonl --output out.jsonl --ray       # a Ray cluster: pip install -e ".[ray]"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

# The CLI takes GPU memory as it needs it: preallocating most of an H200, as JAX does by default, costs about
# a second of every start-up (docs/results.md). Set the variable to "true" to preallocate.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from jspec.config import (ATTENTION_IMPLS, DEFAULT_CLIPS, EMPTY_PROMPT, MAX_LOOKAHEAD, DraftSpec,  # noqa: E402
                          GenerateConfig, KVConfig, SamplingConfig)
from jspec import __version__  # noqa: E402
from jspec.cli import notes  # noqa: E402
from jspec.paths import cache_root  # noqa: E402

KV, GEN, SAMPLING = KVConfig(), GenerateConfig(), SamplingConfig()


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """A usage error is one line (argparse would print the whole usage block first)."""
        self.exit(2, f"error: {message} (see --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except where the help already says it or there is none to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, [], False):
            return text
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="jspec generate", description=__doc__.split("\n")[0],
                formatter_class=_HelpFormatter)
    p.add_argument("--version", action="version", version=f"jspec {__version__}")
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompts; '-' reads one prompt from stdin")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    m = p.add_argument_group("models")
    m.add_argument("--model", help="target Hugging Face directory or GGUF file (default: the shipped "
                                   "checkpoints/code-target)")
    m.add_argument("--draft", default="shipped",
                   help="drafter: a draft model's directory, or an EAGLE-3 head's (config architectures "
                        "LlamaForCausalLMEagle3); 'ngram' (prompt lookup, no model); 'ngram+DIR' or "
                        "'ngram+shipped' (the n-gram copy where it matches, the model elsewhere); 'self' (the "
                        "target over the BF16 window of its own cache, no extra weights); 'ngram+self'; 'self-skip' "
                        "(the target's first layers over that window: --draft-layers); 'none' (no speculation); "
                        "'shipped': the shipped draft with the shipped target; 'auto': the drafter and K chosen per "
                        "call from their costs and observed acceptance (plain decoding when none pays), what it "
                        "learns kept on disk for later runs (JSPEC_LEARN=memory: not; docs/design.md)")
    m.add_argument("--draft-layers", type=int, default=None, metavar="N",
                   help="with --draft self-skip (or ngram+self-skip): the target's first N layers draft, then its "
                        "norm and LM head (default: 3/4 of its layers)")
    m.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="compute dtype")
    m.add_argument("--attn", "--attn-impl", choices=ATTENTION_IMPLS, default="auto",
                   help="INT2 attention: Pallas kernel (GPU; pallas: the Mosaic wgmma kernel on Hopper, else Triton) "
                        "or the pure-jnp reference; auto picks by backend (the library's attn_impl)")
    m.add_argument("--mesh", default="auto",
                   help="devices as 'tp=N,dp=M' (tensor-parallel target x data-parallel batch); "
                        "auto: every local device data-parallel; none: one device")
    m.add_argument("--scan-layers", action="store_true",
                   help="each forward's loop over the layers rolled on a GPU too (the CPU's default): programs that "
                        "compile ~4x and load ~17x faster, a decode step 0-6%% slower (INT2; BF16 11%% at batch 1, "
                        "H200)")
    c = p.add_argument_group("KV cache (OSCAR)")
    c.add_argument("--kv", choices=("auto", "bf16", "int2"), default="auto",
                   help="auto: int2 when the model directory holds rotations.safetensors, else bf16")
    c.add_argument("--sink", type=int, default=KV.sink, help="BF16 sink tokens")
    c.add_argument("--recent", type=int, default=KV.recent, help="BF16 recent window")
    c.add_argument("--group-size", type=int, default=KV.group_size, help="INT2 group size (default: head_dim)")
    c.add_argument("--rotation", "--rotation-mode", choices=("auto", "none", "hadamard", "oscar"), default="auto",
                   help="auto: oscar when a rotation file exists, else hadamard for int2 (the library's "
                        "rotation_mode)")
    c.add_argument("--rotations", help="rotation file (default: MODEL/rotations.safetensors; for FILE.gguf, "
                                       "FILE.rotations.safetensors beside it)")
    c.add_argument("--clip-k", type=float, default=KV.clip_k,
                   help=f"key clip quantile (<= 0 disables; default: the rotation file's searched clip, else "
                        f"{DEFAULT_CLIPS[0]})")
    c.add_argument("--clip-v", type=float, default=KV.clip_v,
                   help=f"value clip quantile (<= 0 disables; default: the rotation file's searched clip, else "
                        f"{DEFAULT_CLIPS[1]})")
    c.add_argument("--scale-dtype", choices=("bfloat16", "float32"), default=KV.scale_dtype,
                   help="dtype of the INT2 scales and zero points")
    g = p.add_argument_group("generation")
    g.add_argument("--lookahead", type=_lookahead, default=GEN.lookahead,
                   help=f"K draft tokens per round (0..{MAX_LOOKAHEAD}), or auto: K per call (0 = no speculation) "
                        "from costs measured on the device and the acceptance expected")
    g.add_argument("--max-new-tokens", type=int, default=GEN.max_new_tokens, help="tokens to generate per prompt")
    g.add_argument("--temperature", type=float, default=SAMPLING.temperature, help="0 is greedy")
    g.add_argument("--top-k", type=int, default=SAMPLING.top_k, help="0 disables")
    g.add_argument("--top-p", type=float, default=SAMPLING.top_p, help="1 disables")
    g.add_argument("--seed", type=int, default=SAMPLING.seed, help="sampling seed (per row in jobs)")
    g.add_argument("--no-heal", dest="heal", action="store_false",
                   help="no token healing: the prompt's last token is kept as given (by default it is backed off "
                        "and the first new token starts with its text, so that a prompt ending in a newline or "
                        "mid-word continues as its text would; not for --chat)")
    g.add_argument("--stop", action="append", default=[], metavar="STR",
                   help="stop string (repeatable): the text ends right before the first one generated, and the row "
                        "stops in that round (a job line's own \"stop\" replaces these)")
    o = p.add_argument_group("output and jobs")
    o.add_argument("--json", action="store_true", help="one JSON object per prompt")
    o.add_argument("--chat", action="store_true",
                   help="each prompt is one user message, rendered with the model's chat template")
    o.add_argument("--stream", action="store_true",
                   help="print each speculative round's tokens as they come (one host sync per round)")
    o.add_argument("--input", type=Path, help="JSONL job: {\"id\", \"prompt\", ...} per line, or OpenAI's batch "
                                              "format ({\"custom_id\", \"url\", \"body\"}), answered in kind")
    o.add_argument("--output", type=Path,
                   help="JSONL results (appended; a re-run skips the lines answered, if the input has not changed)")
    o.add_argument("--restart", action="store_true",
                   help="discard the results already in --output (a jspec results file) and start the job over")
    o.add_argument("--batch-size", type=int, default=8,
                   help="prompts (job rows) per compiled batch; in a job, rows refilled as they finish")
    o.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the job on a Ray cluster, one engine per GPU (pip install -e '.[ray]'); ADDRESS: the "
                        "cluster's "
                        "(without one: RAY_ADDRESS, else a cluster on this machine)")
    o.add_argument("-v", "--verbose", action="store_true",
                   help="the library's log on stderr: one line per phase (load, rotations, compile or cache hit, "
                        "decode), with its time")
    o.add_argument("--compile-cache", default=str(cache_root() / "xla"),
                   help="JAX persistent compilation cache directory ('' disables)")
    o.add_argument("--compile-cache-gib", type=float, default=4.0,
                   help="size bound of the compilation cache: the least recently used programs are evicted")
    return p


def _lookahead(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or an integer, got {text!r}") from None


def _check(a) -> None:
    """The rules about the command line itself; the values' own rules are the configs' (_configs)."""
    bad = [(a.batch_size < 1, "--batch-size must be >= 1"),
           (not 0 < a.compile_cache_gib < 2**20, "--compile-cache-gib must be a positive size"),
           (a.restart and a.input is None, "--restart goes with --input and --output"),
           (a.ray is not None and a.input is None, "--ray goes with --input and --output"),
           ((a.input is None) != (a.output is None), "--input and --output go together"),
           (a.input is not None and bool(a.prompts or a.prompt), "give prompts or --input, not both"),
           (a.stream and (a.json or a.input is not None), "--stream prints text: it does not combine with "
                                                          "--json or --input"),
           (a.chat and (a.stream or a.input is not None), "--chat does not combine with --stream or --input"),
           (a.draft_layers is not None and DraftSpec.parse(a.draft).model != "self-skip",
            "--draft-layers goes with --draft self-skip or ngram+self-skip"),
           (a.draft_layers is not None and a.draft_layers < 1, "--draft-layers must be >= 1")]
    for cond, msg in bad:
        if cond:
            raise ValueError(msg)


def _configs(a) -> tuple[KVConfig, GenerateConfig, SamplingConfig]:
    """The run's configs, every value checked (before the slow model load)."""
    kv = KVConfig(mode=a.kv, sink=a.sink, recent=a.recent, group_size=a.group_size, clip_k=a.clip_k,
                  clip_v=a.clip_v, scale_dtype=a.scale_dtype)
    gen = GenerateConfig(max_new_tokens=a.max_new_tokens, lookahead=a.lookahead, stop=tuple(a.stop),
                         heal=a.heal and not a.chat)
    sampling = SamplingConfig(a.temperature, a.top_k, a.top_p, a.seed)
    kv.check_values()
    gen.validate()
    sampling.validate()
    return kv, gen, sampling


def _prompts(a) -> list[str]:
    if "-" in a.prompts and sys.stdin is None:
        raise ValueError("'-' reads a prompt from stdin, but stdin is closed")
    prompts = [sys.stdin.read().removesuffix("\n") if p == "-" else p for p in a.prompts] + a.prompt
    if not prompts and a.input is None:
        raise ValueError("give a prompt (positional, --prompt, or '-' for stdin) or --input")
    if "" in prompts:  # the library's rule, checked before the model load
        raise ValueError(EMPTY_PROMPT)
    return prompts


def _summary(s) -> str:
    """The stats line of one row (engine.Stats), in words."""
    spec = f", accept_length {s.accept_length:.2f}, accept_rate {s.accept_rate:.2f}" if s.lookahead else ""
    auto = s.lookahead_auto
    timed = f", costs measured in {auto['measure_s']:.1f}s" if auto and auto["measure_s"] >= 0.05 else ""
    why = (f" (auto: expected acceptance {auto['alpha']:.2f} per draft, predicted {auto['predicted_speedup']:.2f}x"
           f"{timed})") if auto else ""
    k = f", {s.draft_mode} K {s.lookahead}{why}" if s.draft_mode != "none" else ""
    if s.speculation:  # draft auto: the winner among the priced candidates
        won = max(s.speculation["why"]["candidates"], key=lambda c: c["predicted_speedup"])
        k = f", auto chose {s.draft_mode} K {s.lookahead} (predicted {won['predicted_speedup']:.2f}x){timed}"
    bf16 = f" (bf16 would be {s.bf16_kv_bytes / 2**20:.1f} MiB at this length)" if s.kv_mode == "int2" else ""
    built = f"compile cache hit {s.compile_s:.1f}s" if s.compile_cached else f"compile {s.compile_s:.1f}s"
    return (f"[{s.new_tokens} tokens, {s.rounds} rounds{k}{spec}, kv {s.kv_mode} "
            f"{s.batch_kv_bytes / 2**20:.1f} MiB per batch{bf16}, {built}, decode {s.decode_s:.2f}s, "
            f"{s.batch_tokens_per_s:.0f} tok/s]")


def main(argv=None, interrupts: Interrupts | None = None) -> int:
    """The CLI; returns the exit status. interrupts: set by cli(), which ends the process on Ctrl-C even
    while XLA compiles or runs."""
    try:
        a = parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or a usage error already printed on one line (2)
        return e.code if isinstance(e.code, int) else 0
    message = "interrupted" + ("; the output holds every finished record: run the same command to resume"
                               if a.input else "")
    if interrupts is not None:
        interrupts.message = message
    try:
        _check(a)
        configs = _configs(a)
        return _run(a, _prompts(a), *configs)
    except KeyboardInterrupt:
        if interrupts is not None:
            interrupts.wait()
        print(message, file=sys.stderr)  # main called in-process, without cli()'s watcher
        return 130
    except BrokenPipeError:  # not an OSError to report: cli() ends quietly
        raise
    except (ValueError, FileNotFoundError, OSError) as e:  # ConfigError and CheckpointError are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(a, prompts: list[str], kv: KVConfig, gen: GenerateConfig, sampling: SamplingConfig) -> int:
    from jspec.jobs import batch
    from jspec.runtime import engine
    from jspec.runtime.startup import compile_cache

    _check_platform()
    if a.verbose:
        notes.verbose()
    if a.compile_cache:
        compile_cache.use_compile_cache(a.compile_cache, max_gib=a.compile_cache_gib)
    data = batch.preflight(a.input, a.output, a.restart) if a.input is not None else None
    if a.ray is not None:  # each Ray actor loads the model
        return _run_ray(a, kv, gen, sampling)
    notes.say(f"loading {a.model or 'the shipped code model'}")
    eng = engine.load(a.model, a.draft, kv=kv, rotation_mode=a.rotation, rotations=a.rotations, dtype=a.dtype,
                      attn_impl=a.attn, mesh=a.mesh, scan_layers=a.scan_layers, draft_layers=a.draft_layers)
    eng.say = notes.say
    if a.kv == "auto" and not eng.kv.int2:
        print(f"note: no rotation file for this model: a BF16 KV cache (make one for the INT2 cache, about 7x "
              f"smaller: jspec calibrate --model {a.model} --data 'some/text/*.py')", file=sys.stderr)
    if a.draft == "shipped" and eng.draft_mode == "ngram":
        print("note: no draft model ships with this model: drafting by n-gram lookup (--draft DIR for a draft model, "
              "--draft none for plain decoding)", file=sys.stderr)
    if a.input is not None:
        summary = batch.run_job(eng, a.input, a.output, gen, sampling, a.batch_size, restart=a.restart, data=data)
        print(json.dumps(summary.as_dict()) if a.json else summary.line(), file=sys.stderr)
        return 0
    if a.stream:
        for prompt in prompts:
            print(prompt, end="", flush=True)
            pieces = eng.stream(prompt, gen, sampling)
            while True:
                try:
                    print(next(pieces), end="", flush=True)
                except StopIteration as done:  # the row's stats
                    print()
                    print(_summary(done.value), file=sys.stderr)
                    break
        return 0
    t0, summary = time.perf_counter(), batch.Summary()
    for i in range(0, len(prompts), a.batch_size):  # --batch-size prompts per compiled call
        results = _chat(eng, prompts[i : i + a.batch_size], gen, sampling) if a.chat else \
            eng.generate(prompts[i : i + a.batch_size], gen, sampling)
        summary.add([r.stats for r in results])
        for r in results:
            if a.json:
                print(json.dumps({"prompt": r.prompt, "text": r.text, "token_ids": r.token_ids, "stats": r.stats.as_dict()}))
            else:
                print(r.prompt + r.text)
                print(_summary(r.stats))
    if len(prompts) > 1:  # the end-of-run summary, on stderr so that stdout stays one record per prompt
        summary.wall_s = time.perf_counter() - t0
        print(json.dumps(summary.as_dict()) if a.json else summary.line(), file=sys.stderr)
    return 0


def _check_platform() -> None:
    """JAX_PLATFORMS naming a GPU that JAX cannot open is one error line (JAX itself fails an assertion)."""
    want = os.environ.get("JAX_PLATFORMS", "")
    if not {"cuda", "gpu", "rocm"} & set(want.split(",")):
        return
    import jax

    try:
        jax.devices()
    except (RuntimeError, AssertionError):
        raise ValueError(f"JAX_PLATFORMS={want}, but JAX sees no GPU: install jspec for CUDA (in the clone: "
                         "pip install -e '.[cuda12]' or '.[cuda13]', see the README), check nvidia-smi, or unset "
                         "JAX_PLATFORMS "
                         "to run on the CPU") from None


def _chat(eng, prompts: list[str], gen: GenerateConfig, sampling: SamplingConfig) -> list:
    """--chat: each prompt as one user message in the model's chat template, generated as one batch."""
    from jspec.io import chat

    if eng.chat_template is None:
        raise ValueError("--chat: the model has no chat template (tokenizer_config.json, chat_template.jinja or "
                         "GGUF metadata)")
    named = chat.special_tokens(eng.tokenizer)
    texts = [chat.render(eng.chat_template, [{"role": "user", "content": p}], **named) for p in prompts]
    results = eng.generate([eng.tokenizer.encode(t, add_special_tokens=False) for t in texts], gen, sampling)
    return [dataclasses.replace(r, prompt=t) for r, t in zip(results, texts)]


def _run_ray(a, kv: KVConfig, gen: GenerateConfig, sampling: SamplingConfig) -> int:
    from jspec.jobs import ray_jobs

    load = dict(model=a.model, draft=a.draft, kv=kv, rotation_mode=a.rotation, rotations=a.rotations, dtype=a.dtype,
                attn_impl=a.attn, mesh=a.mesh, scan_layers=a.scan_layers,
                **({} if a.draft_layers is None else dict(draft_layers=a.draft_layers)))  # (a job's settings as before)
    summary = ray_jobs.run_job(load, a.input, a.output, gen, sampling, a.batch_size, address=a.ray or None,
                               restart=a.restart, compile_cache=(a.compile_cache, a.compile_cache_gib)
                               if a.compile_cache else None)
    print(json.dumps(summary.as_dict()) if a.json else summary.line(), file=sys.stderr)
    return 0


class Interrupts:
    """Ctrl-C (SIGINT) and SIGTERM end the process at any stage, with status 130 and 143, saying the same. Python
    raises KeyboardInterrupt only between bytecodes: while XLA compiles or runs a program (minutes for a large one)
    it would wait, and the GIL can stay taken until the compile ends. So a watcher thread reads the byte that the
    C-level signal handler writes to a wakeup pipe, prints the message and ends the process at once, needing nothing
    from the main thread. A job's output keeps whole records: one write per batch, and a torn record is cut on resume."""

    def __init__(self):
        self.message = "interrupted"
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        # SIGTERM as Ctrl-C: a Python handler, so that its number reaches the pipe too
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        threading.Thread(target=self._watch, args=(r,), daemon=True).start()

    def _watch(self, r: int) -> None:
        while (sig := os.read(r, 1)[0]) not in (signal.SIGINT, signal.SIGTERM):
            pass
        os.write(2, (self.message + "\n").encode())  # os.write: no lock that the main thread may hold
        os._exit(128 + sig)

    @staticmethod
    def wait() -> None:
        """For a main thread that got the KeyboardInterrupt too: the watcher is ending the process."""
        time.sleep(10)


def cli(argv=None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # what was printed is out, even if Ctrl-C ends the process
    try:
        rc = main(argv, interrupts=Interrupts())
        sys.stdout.flush()
        return rc
    except BrokenPipeError:  # `| head`: the reader has gone, which is no error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, as a tool killed by the signal would


def run(argv=None) -> None:
    """The process's entry: cli, then exit at once."""
    status = cli(argv)
    sys.stderr.flush()
    # Everything is written by now (job records at each batch, the compilation cache at each compile):
    # skip the interpreter's teardown of JAX's client, caches and modules, about a second on CPU.
    os._exit(status)


if __name__ == "__main__":
    run()
