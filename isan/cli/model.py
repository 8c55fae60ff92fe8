"""``isan model check`` and ``isan verify``: can the state diverge, are the files whole."""

from __future__ import annotations

from pathlib import Path

import click

from isan.cli.helpers import UserError, emit_json, friendly, load_engine, main


@main.group("model")
def model_group():
    """Diagnose a model."""


@model_group.command("check")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--max-chars", type=int, default=2000, show_default=True, help="Characters per repeated run.")
@click.option("--json", "as_json", is_flag=True)
@friendly
def model_check(model, max_chars, as_json):
    """Which letters, and which pairs of letters, when repeated make the model's state diverge.

    Each symbol x and each pair xy is repeated from h0 (float64) for up to --max-chars
    characters; a run diverges when max |h| exceeds the engine's limit, the point where scoring
    stops with exit status 2. Text that repeats one of these for that long cannot be scored.
    """
    engine = load_engine(model, "reference")
    if not hasattr(engine, "check_divergence"):
        raise UserError(f"`isan model check` needs an ISAN bundle; this is a {engine.describe().get('kind')} model")
    r = engine.check_divergence(max_chars=max_chars)
    if as_json:
        emit_json(r)
        return
    click.echo(f"repeats from h0, up to {r['max_chars']:,} characters; diverging = max |h| > {r['limit']:g}")
    letters = ", ".join(f"{x['symbol']!r} {x['after_chars']}" for x in r["letters"]) or "none"
    click.echo(f"letters that diverge ({len(r['letters'])} of {r['n_letters_checked']}; characters until then): {letters}")
    pairs = r["pairs"]
    shown = ", ".join(f"{x['pair']!r} {x['after_chars']}" for x in pairs[:20])
    more = f", ... ({len(pairs) - 20} more; --json lists all)" if len(pairs) > 20 else ""
    click.echo(f"pairs that diverge ({len(pairs)} of {r['n_pairs_checked']}): {shown or 'none'}{more}")
    click.echo(f"converged: {r['converged']}, undecided after {r['max_chars']:,} characters: {r['undecided']} "
               f"({r['seconds']:.1f} s)")


# --------------------------------------------------------------------------------------- verify
@main.command("verify")
@click.argument("bundle", required=False, default=None)
@click.option("--json", "as_json", is_flag=True)
@friendly
def verify(bundle, as_json):
    """Check every file of BUNDLE (default: the shipped model) against the sha256 its manifest records.

    Also checks the manifest's own hash, the trie table (every section, and the cached table of
    a recipe), and the ONNX graphs (in the bundle, or cached on first use). Exit status 2 if
    anything is damaged.
    """
    from isan.engine.core import default_model_path, verify_all

    r = verify_all(Path(bundle) if bundle else default_model_path())
    if as_json:
        emit_json(r)
    else:
        for name, status in r["checked"].items():
            click.echo(f"{status if status == 'ok' else 'BAD'}\t{name}" + ("" if status == "ok" else f"\t{status}"))
        for key in ("table", "cached_table", "onnx"):
            if r.get(key) is not None:
                click.echo(f"{'ok' if r[key] == 'ok' else 'BAD'}\t{key}" + ("" if r[key] == "ok" else f"\t{r[key]}"))
        for name in r["unlisted"]:
            click.echo(f"note\t{name}\tnot listed in the manifest")
        if r.get("warning"):
            click.echo(f"warning: {r['warning']}")
    if not r["ok"]:
        raise UserError(f"{len(r['problems'])} problem(s); first: {r['problems'][0]}")
    if not as_json:
        click.echo(f"{r['bundle']}: ok")
