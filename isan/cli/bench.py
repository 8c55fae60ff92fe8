"""``isan bench``: engine, budgets, train, onnx, serve (the benchmarks live in :mod:`isan.bench`)."""

from __future__ import annotations


import click

from isan.errors import IsanError, install_hint

from isan.cli.helpers import (DEFAULT_TEXT8, POSITIVE_FLOAT, POSITIVE_INT, SEED, ByteSize, CommaList, IntList,
                              friendly, main)


@main.group(short_help="Benchmarks, with ratios against a baseline in the same run.")
def bench():
    """Benchmarks: medians over repeats, ratios against a baseline run in the same process."""


def chunk_sizes(spec: str) -> str:
    """``--chunk-chars`` as given, once :func:`isan.bench.serve.parse_chunk_chars` reads it (N, or MIN-MAX with
    1 <= MIN <= MAX); anything else is a usage error (exit 2) before the benchmark starts."""
    from isan.bench.serve import parse_chunk_chars

    try:
        parse_chunk_chars(spec)
    except IsanError as e:
        raise click.BadParameter(str(e), param_hint="'--chunk-chars'") from None
    return spec


def _report(table: str, result: dict, out: str | None, plot_fn=None, plot_path: str | None = None) -> None:
    """Print a benchmark's table, then write its JSON (``out``) and its plot (``plot_path``) where asked."""
    from isan.bench.common import write_json

    click.echo(table)
    if out:
        write_json(result, out)
        click.echo(f"\nwrote {out}")
    if plot_path:
        plot_fn(result, plot_path)
        click.echo(f"wrote {plot_path}")


@bench.command("engine", short_help="Scoring throughput: long text, streaming, batched, peers.")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True,
              help="text8 file: scoring runs on the characters after text8-10M (from offset 10,000,000).")
@click.option("--repeats", type=POSITIVE_INT, default=3, show_default=True)
@click.option("--threads", type=IntList(min=1), default=None,
              help="Threads for the compiled kernels (default: all this process may use); a list (1,2,4) adds a "
                   "scaling table over them, the rest on the largest.")
@click.option("--peers/--no-peers", default=True, show_default=True,
              help="Also run onnxruntime's LSTM of equal parameters and KenLM (where installed).")
@click.option("--quick", is_flag=True, help="Small sizes (60,000 characters of long text): a check that it runs, not a measurement.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@click.option("--plot", default=None, help="Write the plot of chars/s against rows and threads (per-symbol steps vs "
                                           "composed jumps) here, a PNG (nothing is written without it).")
@friendly
def bench_engine_cmd(model, data, repeats, threads, peers, quick, progress, out, plot):
    """Long-text (2.5M unseen characters, chunk-parallel, one character a step and by composed
    jumps), streaming (1,000-character chunks, float32 and float16 tables), batched (256 and 4,096 x
    2,000, both kernels) and ingestion throughput against the per-character reference in the same
    process, useful GFLOP/s against the measured FMA peak, a sweep over rows and threads, with
    onnxruntime's LSTM and KenLM as peers; start-up, memory, exactness and where the time goes."""
    from isan.bench.engine import QUICK_SIZES, bench_engine, markdown
    from isan.bench.sweep import plot_sweep

    scaling = None
    if threads is not None:
        threads, scaling = max(threads), (list(threads) if len(threads) > 1 else None)
    result = bench_engine(model, data, repeats=repeats, threads=threads, peers=peers, progress=progress,
                          log=lambda m: click.echo(m, err=True), sizes=QUICK_SIZES if quick else None, scaling=scaling)
    _report(markdown(result), result, out, plot_sweep, plot)


@bench.command("gpu", short_help="GPU scoring (torch backend) against the CPU, and its exactness.")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True,
              help="A text8 file: the long text (all of it) and the documents (drawn from it).")
@click.option("--device", default="cuda", show_default=True, help="cuda, cuda:N, or cpu (torch on the CPU: a check).")
@click.option("--repeats", type=POSITIVE_INT, default=3, show_default=True)
@click.option("--docs", type=POSITIVE_INT, default=None, help="Documents (default 65,536).")
@click.option("--doc-chars", type=POSITIVE_INT, default=None, help="Characters a document (default 512).")
@click.option("--quick", is_flag=True, help="Small sizes on any device: a check that it runs, not a measurement.")
@click.option("--steps", default=None,
              help="Comma-separated DTYPE:STEP runs (STEP mm, triton or triton-tf32x3; default: every one the "
                   "device has: float32:mm,float32:triton,float32:triton-tf32x3,float64:mm,float64:triton on a GPU).")
@click.option("--profile", is_flag=True, help="Also profile one call of the documents on the first run (torch.profiler): "
                                              "where the time goes, by kernel.")
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@friendly
def bench_gpu_cmd(model, data, device, repeats, docs, doc_chars, quick, steps, profile, out):
    """The torch backend on a GPU against the CPU's compiled kernels in the same process:
    documents (65,536 x 512 by default) and one long text chunk-parallel, float32 and float64, with
    the exactness of each against the float64 reference. Needs torch (the gpu extra)."""
    from isan.bench.gpu import GPU_RUNS, QUICK_SIZES, bench_gpu, markdown

    sizes = dict(QUICK_SIZES) if quick else {}
    if docs is not None:
        sizes["docs"] = docs
    if doc_chars is not None:
        sizes["doc_chars"] = doc_chars
    runs = None
    if steps:
        runs = []
        dtypes, step_names = sorted({d for d, _ in GPU_RUNS}), sorted({x for _, x in GPU_RUNS})
        for item in steps.split(","):
            dt, _, st = item.strip().partition(":")
            if dt not in dtypes or st not in step_names:
                raise click.BadParameter(f"{item!r}: want DTYPE:STEP, DTYPE {' or '.join(dtypes)}, STEP "
                                         f"{', '.join(step_names)}", param_hint="--steps")
            runs.append((dt, st))
    result = bench_gpu(model, data, device=device, repeats=repeats, sizes=sizes, runs=runs, profile=profile,
                       log=lambda m: click.echo(m, err=True))
    _report(markdown(result), result, out)


@bench.command("host", short_help="The torch path's host side, its device work left out.")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True,
              help="A text8 file: the long text (all of it), and the documents (its ids end to end, cut).")
@click.option("--device", default="cpu", show_default=True,
              help="The torch device whose host side is timed: cpu, cuda or cuda:N.")
@click.option("--docs", type=POSITIVE_INT, default=None, help="Documents a batch (default 65,536).")
@click.option("--doc-chars", type=POSITIVE_INT, default=None, help="Characters a document (default 512).")
@click.option("--batches", type=POSITIVE_INT, default=None, help="Batches of the overlapped row (default 4).")
@click.option("--repeats", type=POSITIVE_INT, default=None, help="Timed runs a row, the median kept (default 5).")
@click.option("--before", type=click.Path(exists=True, file_okay=False), default=None,
              help="A folder holding an older isan package: the same rows measured with it, in a subprocess, "
                   "and the ratios.")
@click.option("--quick", is_flag=True, help="Small sizes: a check that it runs, not a measurement.")
@click.option("--profile", is_flag=True, help="Also cProfile one more run of each row: the host's functions by time.")
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@friendly
def bench_host_cmd(model, data, device, docs, doc_chars, batches, repeats, before, quick, profile, out):
    """The host side of the torch path (what it could feed a device that took no time: the steps
    and readout replaced by a benchmark double): one call of 65,536 documents x 512 characters
    (each one's total), overlapped batches, the long text as ids and as a str, and the corpus
    scoring process; with --before, the same measured with an older isan and after/before."""
    from isan.bench.host import QUICK_SIZES, bench_host, markdown

    sizes = dict(QUICK_SIZES) if quick else {}
    given = {"docs": docs, "doc_chars": doc_chars, "batches": batches, "repeats": repeats}
    sizes.update({k: v for k, v in given.items() if v is not None})
    result = bench_host(model, data, device=device, sizes=sizes, before=before, profile=profile,
                        log=lambda m: click.echo(m, err=True))
    _report(markdown(result), result, out)


@bench.command("frontier", short_help="Models of several widths: test bpc, chars/s, KenLM.")
@click.option("--models", default=None,
              help="Comma-separated bundle directories (default: the shipped text8 model). Ratios are against the first.")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8 file: its test split and unseen text.")
@click.option("--repeats", type=POSITIVE_INT, default=3, show_default=True)
@click.option("--long-chars", type=POSITIVE_INT, default=2_500_000, show_default=True, help="Unseen characters a timing scores.")
@click.option("--kenlm/--no-kenlm", default=True, show_default=True, help="KenLM's point (its order-8 n-gram; needs kenlm).")
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@click.option("--plot", "plot_out", default=None, help="Write the plot of bpc against chars/s here (PNG; the plot extra).")
@friendly
def bench_frontier_cmd(models, data, repeats, long_chars, kenlm, out, plot_out):
    """The size-speed frontier (issue 37): each bundle's exact test bpc and its scoring speed (all
    threads and one) in one process, with KenLM's point beside them."""
    from isan.bench.frontier import bench_frontier, markdown, plot

    paths = [m.strip() for m in models.split(",") if m.strip()] if models else None
    result = bench_frontier(paths, data, repeats=repeats, long_chars=long_chars, kenlm=kenlm,
                            log=lambda m: click.echo(m, err=True))
    _report(markdown(result), result, out, plot, plot_out)


@bench.command("budgets", short_help="Streaming speed against the table's size and storage type.")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8 file: mined on train, timed on test.")
@click.option("--budgets", type=CommaList(ByteSize()), default="8MB,16MB,32MB,128MB", show_default=True,
              help="Table sizes, comma-separated (e.g. 512KB,16MB,1GB).")
@click.option("--dtypes", default="float32,float16", show_default=True)
@click.option("--chars", type=POSITIVE_INT, default=200_000, show_default=True, help="Test characters streamed per timing.")
@click.option("--repeats", type=POSITIVE_INT, default=3, show_default=True)
@click.option("--threads", type=POSITIVE_INT, default=None, help="Threads for the second column (default: all this process may use).")
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@friendly
def bench_budgets_cmd(model, data, budgets, dtypes, chars, repeats, threads, out):
    """Streaming through the table (1,000-character calls) against its size and storage type:
    longer matches against jumps that read from memory rather than the L3 cache."""
    from isan.bench.common import write_json
    from isan.bench.engine import bench_budgets, markdown_budgets
    from isan.data import read_text8_split

    result = bench_budgets(model, read_text8_split(data, "train"), read_text8_split(data, "test"),
                           list(budgets), repeats=repeats, chars=chars,
                           dtypes=tuple(d.strip() for d in dtypes.split(",") if d.strip()), threads=threads,
                           log=lambda m: click.echo(m, err=True))
    click.echo(markdown_budgets(result))
    if out:
        write_json(result, out)
        click.echo(f"\nwrote {out}")


@bench.command("train", short_help="Training throughput of each Table 1 model (needs torch).")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8 file; chunks of the train split are used.")
@click.option("--budgets", default=None, help="Comma-separated parameter budgets (default: Table 1's).")
@click.option("--models", default=None, help="Comma-separated models (default: Table 1's five, the ISAN first).")
@click.option("--batch", type=POSITIVE_INT, default=32, show_default=True, help="Streams B (the Table 1 protocol's).")
@click.option("--steps", type=POSITIVE_INT, default=5, show_default=True, help="Optimizer steps per timing.")
@click.option("--repeats", type=POSITIVE_INT, default=3, show_default=True)
@click.option("--reference/--no-reference", default=True, show_default=True,
              help="Also time the baselines' per-step loop (forward_reference).")
@click.option("--threads", type=POSITIVE_INT, default=None, help="torch CPU threads (default: torch's).")
@click.option("--device", default="cpu", show_default=True, help="torch device: cpu, cuda or cuda:N.")
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@friendly
def bench_train_cmd(data, budgets, models, batch, steps, repeats, reference, threads, device, out):
    """Training throughput (chars/s of forward+backward+Adam) of each Table 1 model at each budget (needs torch)."""
    try:
        from isan.bench.train import bench_train, markdown_train
    except ImportError as e:
        raise IsanError(f"`isan bench train` needs torch ({e}): {install_hint('train')}") from None
    import numpy as np

    from isan.alphabet import Alphabet
    from isan.bench.common import write_json
    from isan.data import read_text8_split
    from isan.train.models import MODELS

    chosen = {}  # only what was given; bench_train's defaults are Table 1's budgets and models
    if models is not None:
        names = tuple(m.strip() for m in models.split(",") if m.strip())
        unknown = [m for m in names if m not in MODELS]
        if unknown or not names:
            raise click.BadParameter(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}", param_hint="--models")
        chosen["models"] = names
    if budgets is not None:
        try:
            chosen["budgets"] = [(b.strip(), POSITIVE_FLOAT.convert(b, None, None)) for b in budgets.split(",")
                                 if b.strip()]
        except click.BadParameter:
            raise click.BadParameter(f"{budgets!r} is not a comma-separated list of finite numbers above 0",
                                     param_hint="'--budgets'") from None
    ids = Alphabet.text8().encode(read_text8_split(data, "train")[:2_000_000]).astype(np.int64)
    result = bench_train(ids, **chosen, batch=batch, steps=steps, repeats=repeats, reference=reference,
                         threads=threads, device=device, log=lambda m: click.echo(m, err=True))
    if out:
        write_json(result, out)
    click.echo(markdown_train(result))
    if out:
        click.echo(f"\nwrote {out}")


@bench.command("onnx", short_help="onnxruntime: ISAN d=216 against an LSTM of equal parameters.")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8 file; the test split is used.")
@click.option("--repeats", type=POSITIVE_INT, default=3, show_default=True)
@click.option("--batch", type=POSITIVE_INT, default=64, show_default=True, help="Streams in the batched measurement.")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True)
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@friendly
def bench_onnx_cmd(data, repeats, batch, device, out):
    """onnxruntime: ISAN d=216 vs an LSTM of equal parameters (548 units): step latency, streaming, batched."""
    from isan.bench.common import write_json
    from isan.bench.engine import bench_onnx, markdown_onnx
    from isan.data import read_text8_split

    result = bench_onnx(read_text8_split(data, "test"), repeats=repeats, batch=batch, device=device,
                        log=lambda m: click.echo(m, err=True))
    if out:
        write_json(result, out)
    click.echo(markdown_onnx(result))
    if out:
        click.echo(f"\nwrote {out}")


@bench.command("serve", short_help="isan-serve under load: HTTP, WebSocket, memory, slow clients.")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8 file: texts from the valid and test splits.")
@click.option("--clients", type=POSITIVE_INT, default=100, show_default=True, help="HTTP clients posting at once.")
@click.option("--text-chars", type=POSITIVE_INT, default=1000, show_default=True, help="Characters per HTTP request.")
@click.option("--duration", type=POSITIVE_FLOAT, default=10.0, show_default=True, help="Seconds of HTTP load.")
@click.option("--streams", type=POSITIVE_INT, default=1000, show_default=True, help="WebSocket streams open at once.")
@click.option("--chunks", type=POSITIVE_INT, default=5, show_default=True, help="Chunks each stream sends.")
@click.option("--chunk-chars", default="1-400", show_default=True, callback=lambda ctx, param, value: chunk_sizes(value),
              help="Characters per chunk: N, or MIN-MAX for sizes drawn uniformly (seeded by --seed).")
@click.option("--big-chars", type=POSITIVE_INT, default=1_000_000, show_default=True, help="Characters of the memory and cancel probes' requests.")
@click.option("--big-requests", type=POSITIVE_INT, default=4, show_default=True, help="Concurrent big requests in the memory probe.")
@click.option("--slow-conns", type=POSITIVE_INT, default=500, show_default=True,
              help="Connections of the slow-body probe (each sends 14 of the 1,000 bytes it declares).")
@click.option("--cancel-clients", type=POSITIVE_INT, default=12, show_default=True,
              help="Clients of the cancel probe (each sends up to 500,000 characters and leaves).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the stream texts and chunk sizes.")
@click.option("--only", default=None,
              help="Which measurements, comma-separated (default: http,completions,stream,memory,cancel,slow; with "
                   "--url: http,completions,stream).")
@click.option("--server-args", default="", help='Options for isan-serve, e.g. "--no-batching --threads 1".')
@click.option("--workers", type=IntList(min=1), default=None,
              help="Worker counts (e.g. 1,2): the measurements run against isan-serve --workers N for each in turn, "
                   "in one run, with the ratio of their requests/s.")
@click.option("--url", default=None,
              help="Measure the server or load balancer already answering at this address (http://HOST:PORT, e.g. "
                   "HAProxy in front of replicas) instead of starting isan-serve: the HTTP and stream load only, "
                   "with --model the endpoint's model.")
@click.option("--out", default=None, help="Also write the results as JSON here.")
@friendly
def bench_serve_cmd(model, data, clients, text_chars, duration, streams, chunks, chunk_chars, big_chars, big_requests,
                    slow_conns, cancel_clients, seed, only, server_args, workers, url, out):
    """isan-serve under load (a real server process on localhost, or with --url a server or balancer already
    running): HTTP requests/s and latency, WebSocket
    chunk latency and memory, memory under concurrent big requests, the work dropped when a client leaves,
    and connections that send their body slowly; every answer is checked against the library's offline bits."""
    import shlex

    from isan.bench.serve import URL_MEASUREMENTS, markdown, run_bench, write_json

    if only is None:
        only = ",".join(URL_MEASUREMENTS) if url else "http,completions,stream,memory,cancel,slow"
    which = tuple(w.strip() for w in only.split(",") if w.strip())
    bad = [w for w in which if w not in ("http", "completions", "stream", "memory", "cancel", "slow")]
    if bad:
        raise click.BadParameter(f"unknown measurement(s) {bad}; choose from http, stream, memory, cancel, slow",
                                 param_hint="--only")
    result = run_bench(model=model, data=data, clients=clients, text_chars=text_chars, duration_s=duration,
                       streams=streams, chunks=chunks, chunk_chars=chunk_chars, big_chars=big_chars,
                       big_requests=big_requests, slow_conns=slow_conns, cancel_clients=cancel_clients, seed=seed,
                       server_args=shlex.split(server_args), which=which,
                       progress=lambda m: click.echo(m, err=True), url=url,
                       workers=workers)
    click.echo(markdown(result))
    if out:
        write_json(result, out)
        click.echo(f"\nwrote {out}")


@bench.command("corpus", short_help="The corpus job's docs/s and chars/s: local, Ray and KenLM.")
@click.option("--data-dir", default="../shared/data", show_default=True,
              help="The shared data: wikitext2/, tinyshakespeare/, text8_head/ (text8 beyond offset 10,000,000).")
@click.option("--mb", type=POSITIVE_FLOAT, default=50.0, show_default=True, help="Size of the JSONL corpus to make (MB).")
@click.option("--files", type=POSITIVE_INT, default=8, show_default=True, help="JSONL files the corpus is cut into.")
@click.option("--cpus-per-node", type=POSITIVE_INT, default=1, show_default=True, help="CPUs of each node of the local 2-node Ray cluster.")
@click.option("--threads", type=POSITIVE_INT, default=None, help="Kernel threads of the local runner (default: all CPUs).")
@click.option("--ray/--no-ray", "with_ray", default=True, show_default=True, help="Also run the Ray runner on a local 2-node cluster.")
@click.option("--kenlm/--no-kenlm", "with_kenlm", default=True, show_default=True, help="Also score the documents with KenLM.")
@click.option("--workers", type=IntList(min=1), default=None,
              help="A scaling table over these numbers of worker processes (e.g. 1,2), one kernel thread each, "
                   "with KenLM in as many processes.")
@click.option("--out", default=None, help="Also write the results as JSON here.")
@friendly
def bench_corpus_cmd(data_dir, mb, files, cpus_per_node, threads, with_ray, with_kenlm, workers, out):
    """The corpus job: docs/s and chars/s of the local runner, of Ray on a local 2-node cluster, and of KenLM
    over the same documents (our order-8 n-gram as ARPA, order 6 where KenLM's build stops there), in one run."""
    from isan.bench.common import write_json
    from isan.bench.corpus import bench_corpus, markdown

    result = bench_corpus(data_dir, mb=mb, files=files, cpus_per_node=cpus_per_node, threads=threads, ray=with_ray,
                          kenlm=with_kenlm, log=lambda m: click.echo(m, err=True),
                          workers=list(workers) if workers else None)
    click.echo(markdown(result))
    if out:
        write_json(result, out)
        click.echo(f"\nwrote {out}")
