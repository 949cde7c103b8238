"""The per-language summary shown at the end of ``prepare`` (terminal table and Prefect artifact)."""

from __future__ import annotations

from typing import Any


def summary_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    blend = manifest.get("blend", {})
    for lang, e in sorted(manifest["languages"].items()):
        rows.append({
            "lang": lang,
            "docs_in": e["docs_in"],
            "kept": e["docs_kept"],
            "filtered": sum(e["filtered"].values()),
            "duplicates": sum(e["duplicates"].values()),
            "errors": sum(e["errors"].values()),
            "valid_docs": e.get("valid_docs", 0),
            "tokens": e["tokens"],
            "blend_%": round(100 * blend.get(lang, 0.0), 3),
            "pii": sum(e["pii"].values()),
            "why_dropped": ", ".join(f"{k}:{v}" for kind in ("filtered", "errors") for k, v in e[kind].items()),
        })
    return rows


def print_summary(manifest: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    rows = summary_rows(manifest)
    table = Table(title="bloomline prepare — per-language summary", show_lines=False)
    cols = ["lang", "docs_in", "kept", "filtered", "duplicates", "errors", "valid_docs", "tokens", "blend_%", "pii"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("lang", "why_dropped") else "right", overflow="fold")
    for r in rows:
        table.add_row(*(f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in cols))
    t = manifest["totals"]
    table.add_row("TOTAL", f"{t['docs_in']:,}", f"{t['docs_kept']:,}", f"{t['filtered']:,}", f"{t['duplicates']:,}",
                  f"{t['errors']:,}", "", f"{sum(e['tokens'] for e in manifest['languages'].values()):,}", "100", "")
    console.print(table)
    sp = manifest.get("splits", {})
    for name, s in sorted(sp.items()):
        console.print(f"{name}: {s['rows']:,} samples, {s['tokens']:,} tokens, padding {100 * s['padding_fraction']:.2f}%")
    for r in rows:
        if r["why_dropped"]:
            console.print(f"{r['lang']} dropped: {r['why_dropped']}", highlight=False)
    examples = [(lang, r, loc) for lang, e in manifest["languages"].items() for r, loc in e.get("error_examples", {}).items()]
    for lang, reason, loc in examples[:20]:
        console.print(f"[yellow]error[/] {lang} {reason}: e.g. {loc}")
