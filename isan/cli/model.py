"""``isan model check`` and ``isan verify``: can the state diverge, are the files whole."""

from __future__ import annotations

from pathlib import Path

import click

from isan.cli.helpers import (POSITIVE_INT, UserError, emit_json, friendly, load_engine, main)


@main.group("model")
def model_group():
    """Diagnose a model."""


@model_group.command("check", short_help="Can any input make the model's state diverge?")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--max-chars", type=POSITIVE_INT, default=2000, show_default=True,
              help="Characters every repeated run is stepped from h0 before slow ones go on in jumps.")
@click.option("--json", "as_json", is_flag=True)
@friendly
def model_check(model, max_chars, as_json):
    """Can any input make the model's state diverge? The certificate, repeats, and a search.

    A certified model (isan train --stable-rho) carries a proof that no input can: it is
    recomputed here from the bundle's own weights. Every model is also checked exactly for
    repeats: a letter x, or a pair xy, repeated diverges if and only if the spectral radius of
    W[x] (of W[y] W[x]) is above 1; for each such run the number of characters from h0 until
    max |h| passes the engine's limit is found, the point where scoring stops with exit status 2.
    Last, a beam search over letters looks for the text that makes |h| largest.
    """
    engine = load_engine(model, "reference")
    if not hasattr(engine, "check_divergence"):
        raise UserError(f"`isan model check` needs an ISAN bundle; this is a {engine.describe().get('kind')} model")
    r = engine.check_divergence(max_chars=max_chars)
    if as_json:
        emit_json(r)
        return
    c = r["certificate"]
    if c is None:
        click.echo("certificate: none (train with `isan train --stable-rho RHO` for a model that cannot diverge)")
    elif c["holds"]:
        click.echo(f"certificate: holds, rho = {c['rho']:.6f} (max over symbols of ||P W_x P^-1||_2, recomputed in "
                   f"float64; cond(P) = {c['cond_P']:.3g}): for every input, max |h_i| <= {c['state_bound']:.4g}, "
                   f"and a start-state error shrinks at least as cond(P) rho^t")
    else:
        click.echo(f"certificate: DOES NOT HOLD: {c['problem']}")
    sr = r["spectral_radius"]
    worst = max(sr["letters"], key=sr["letters"].get)
    click.echo(f"spectral radius: letters up to {sr['max_letter']:.4f} ({worst!r}), pairs up to "
               f"{sr['max_pair']:.4f}; above 1: {r['diverging_letters']} of {r['n_letters_checked']} letters, "
               f"{r['diverging_pairs']} of {r['n_pairs_checked']} ordered pairs")

    def fmt(x, name):
        n = x["after_chars"]
        return f"{x[name]!r} {n:,}" if n is not None else f"{x[name]!r} >{r['max_total_chars']:,}"

    click.echo(f"repeats from h0 that leave the range max |h| <= {r['limit']:g} (characters until then):")
    click.echo(f"  letters ({len(r['letters'])}): " + (", ".join(fmt(x, "symbol") for x in r["letters"]) or "none"))
    pairs = r["pairs"]
    more = f", ... ({len(pairs) - 20} more; --json lists all)" if len(pairs) > 20 else ""
    click.echo(f"  pairs ({len(pairs)}): " + (", ".join(fmt(x, "pair") for x in pairs[:20]) or "none") + more)
    click.echo(f"  the other {r['converging']} repeats converge; their largest fixed point has max |h_i| = "
               f"{r['largest_fixed_point']:.4g}")
    a = r["adversarial"]
    verdict = (f"leaves the range after {a['chars']} characters" if a["diverged"]
               else f"max |h_i| = {a['max_abs_h']:.4g} at most (searched {a['searched_chars']} characters)")
    click.echo(f"adversarial search (beam {a['beam']}): {verdict}; text ...{a['text'][-40:]!r}")
    click.echo(f"({r['seconds'] + a['seconds']:.1f} s)")

@main.command("verify", short_help="Check every file of a bundle against its manifest's sha256.")
@click.argument("bundle", required=False, default=None)
@click.option("--model", default=None, help="The bundle, as every command names it (the same as BUNDLE).")
@click.option("--json", "as_json", is_flag=True)
@friendly
def verify(bundle, model, as_json):
    """Check every file of BUNDLE or --model (default: the shipped model) against the sha256 its manifest records.

    Also checks the manifest's own hash, the trie table (every section, and the cached table of
    a recipe), and the ONNX graphs (in the bundle, or cached on first use). Exit status 2 if
    anything is damaged. A bundle whose manifest records no hashes (format version 1) cannot be
    verified: the last line says so instead of "ok" (exit status 0, nothing found wrong).
    """
    from isan.engine.paths import default_model_path

    from isan.engine.verify import verify_all

    if bundle is not None and model is not None and Path(bundle) != Path(model):
        raise click.UsageError(f"give the bundle once: BUNDLE {bundle!r} and --model {model!r} differ")
    bundle = bundle if bundle is not None else model
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
        click.echo(f"{r['bundle']}: ok" if r["verified"] else
                   f"{r['bundle']}: cannot verify (its manifest records no hashes; nothing else found wrong)")
