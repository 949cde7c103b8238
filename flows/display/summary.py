"""What the commands print at the end: the per-language summary of ``prepare`` (terminal table and
Prefect artifact), the stage table of ``pipeline``, what ``train`` and ``evaluate`` did, and the plan
of ``plan``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bloomline.terminal import printable, rich_escape


def summary_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    blend = manifest.get("blend", {})
    for lang, e in sorted(manifest["languages"].items()):
        rows.append(
            {
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
            }
        )
    return rows


def print_summary(manifest: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    rows = summary_rows(manifest)
    table = Table(title="bloomline prepare — per-language summary", show_lines=False)
    cols = ["lang", "docs_in", "kept", "filtered", "duplicates", "errors", "valid_docs", "tokens", "blend_%", "pii"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("lang", "why_dropped") else "right", overflow="fold")
    for r in rows:
        table.add_row(*(f"{r[c]:,}" if isinstance(r[c], int) else rich_escape(r[c]) for c in cols))
    t = manifest["totals"]
    table.add_row(
        "TOTAL",
        f"{t['docs_in']:,}",
        f"{t['docs_kept']:,}",
        f"{t['filtered']:,}",
        f"{t['duplicates']:,}",
        f"{t['errors']:,}",
        "",
        f"{sum(e['tokens'] for e in manifest['languages'].values()):,}",
        "100",
        "",
    )
    console.print(table)
    sp = manifest.get("splits", {})
    for name, s in sorted(sp.items()):
        console.print(
            f"{name}: {s['rows']:,} samples, {s['tokens']:,} tokens, padding {100 * s['padding_fraction']:.2f}%"
        )
    for r in rows:
        if r["why_dropped"]:
            console.print(printable(f"{r['lang']} dropped: {r['why_dropped']}"), highlight=False, markup=False)
    examples = [
        (lang, r, loc) for lang, e in manifest["languages"].items() for r, loc in e.get("error_examples", {}).items()
    ]
    for lang, reason, loc in examples[:20]:
        console.print(f"[yellow]error[/] {rich_escape(f'{lang} {reason}: e.g. {loc}')}")


def print_pipeline(res: dict, console: Any) -> None:
    """The stage table of `bloomline pipeline` and where its outputs are."""
    from rich.table import Table

    t = Table(title="stages", title_justify="left")
    for col in ("stage", "", "why", "seconds", "folder"):
        t.add_column(col)
    for name, s in res["stages"].items():
        t.add_row(
            name,
            "[cyan]reused[/]" if s["reused"] else "[green]ran[/]",
            rich_escape(s["why"]),  # settings' values, paths: as written
            f"{s['seconds']:.1f}",
            rich_escape(s["folder"]),
        )
    console.print(t)
    console.print(f"[bold green]done[/]: {rich_escape(res['run'])}")
    for label, key in (("dashboard", "dashboard"), ("TensorBoard", "tensorboard"), ("checkpoints", "checkpoints")):
        console.print(f"  {label:<12} {rich_escape(res[key])}")
    if res.get("export"):
        console.print(f"  HF export    {rich_escape(res['export'])}")
    console.print(f"  data         {rich_escape(res['data'])}")
    console.print(f"open TensorBoard: tensorboard --logdir {rich_escape(res['tensorboard'])} --host 127.0.0.1")


def print_plan(res: dict, console: Any) -> None:
    """`bloomline plan`'s table: GiB per device by stage, then FLOPs, bubble, offload and the verdict."""
    if not res["stages"]:
        console.print(f"[bold red]does not fit[/]: {res['reason']}")
        return
    lay, m = res["layout"], res["model"]
    console.print(
        f"{m['params'] / 1e9:.2f} B parameters on TP {lay['tp']} × PP {lay['pp']} × DP {lay['dp']} = "
        f"{lay['world']} × {res['device']['name']} ({lay['nodes']} node(s) of {lay['per_node']}), ZeRO-"
        f"{lay['zero_stage']}, {res['precision']}, micro-batch {res['micro_batch_size']}, global batch "
        f"{res['global_batch_size']}, activation checkpointing {'on' if res['activation_checkpointing'] else 'off'}"
    )
    console.print(_stage_table(res))
    console.print(
        f"FLOPs per iteration {res['flops_per_iteration']:.4g}; pipeline bubble (p-1)/m = "
        f"{res['bubble']:.4f} ({res['micro_batches']} micro-batches per pipeline)"
    )
    if "tflops_per_gpu" in res:
        console.print(
            f"at {res['iteration_seconds']:g} s per iteration: {res['tflops_per_gpu']:.2f} TFLOP/s per device"
            + (f" ({res['mfu']:.1%} of peak)" if "mfu" in res else "")
        )
    ds = res["deepspeed_estimate"]
    console.print(
        f"model states of stage {ds['stage']}, DeepSpeed's estimators vs ours: ZeRO-2 {ds['zero2_gib']:.2f} vs "
        f"{ds['zero2_ours_gib']:.2f} GiB, ZeRO-3 {ds['zero3_gib']:.2f} vs {ds['zero3_ours_gib']:.2f} GiB"
    )
    if "offload" in res:
        o = res["offload"]
        console.print(
            f"ZeRO-Offload: frees {o['gpu_freed_gib']:.2f} GiB per device; costs {o['cpu_gib_per_node']:.1f} GiB "
            f"of CPU memory per node and {o['pcie_gib_per_iteration_per_device']:.2f} GiB over PCIe per device "
            f"per iteration"
            + (f" ({o['pcie_seconds_per_iteration']:.2f} s)" if "pcie_seconds_per_iteration" in o else "")
        )
    console.print(("[bold green]" if res["fits"] else "[bold red]") + res["reason"] + "[/]")
    ev = res.get("evaluation")
    if ev:
        console.print(
            f"evaluation (bloomline evaluate -o parallel.tp={ev['tp']} -o parallel.pp={ev['pp']}): "
            f"{ev['world']} device(s), {ev['nodes']} node(s), {ev['precision']}, batches of {ev['batch_tokens']:,} "
            f"tokens; {ev['reason']}"
            if ev["fits"]
            else f"evaluation: {ev['reason']}",
            highlight=False,
        )
        if "beside_training" in ev:
            console.print(f"evaluation beside training: on {ev['beside_training']['where']}", highlight=False)


def _stage_table(res: dict) -> Any:
    """The plan's GiB per device, one row per pipeline stage."""
    from rich.table import Table

    t = Table(title="GiB per device, by pipeline stage", title_justify="left")
    keys = list(res["stages"][0]["parts_gib"])
    for col in (
        "stage",
        "blocks",
        "params",
        *(k.replace("pipeline_buffers", "pp buffers") for k in keys),
        "total",
        "act. no ckpt",
    ):
        t.add_column(col, justify="right")
    for st in res["stages"]:
        t.add_row(
            f"{st['stage']}{' (emb)' if st['embedding'] else ''}",
            str(st["blocks"]),
            f"{st['params'] / 1e6:,.0f} M",
            *(f"{st['parts_gib'][k]:.2f}" for k in keys),
            f"[bold]{st['memory_gib']:.2f}[/]",
            f"{st['activations_without_checkpointing_gib']:.2f}",
        )
    return t


def print_trained(res: dict, out: Path, console: Any) -> None:
    """What ``bloomline train`` did: the step it reached (or where the kill switch stopped it), and
    the checkpoints evaluated alongside."""
    last = res.get("last", {})
    if res["stopped_by_kill_switch"]:
        console.print(
            f"[yellow]stopped by the kill switch[/] at step {res['step']}: remove {out / 'STOP'} and rerun to continue"
        )
    else:
        console.print(
            f"[bold green]done[/]: step {res['step']}/{res['steps']}, loss {last.get('loss', float('nan')):.4f} "
            f"({res['attempts']} attempt(s)); metrics in {out / 'metrics.jsonl'}"
        )
    ev = res.get("evaluation")
    if ev:
        console.print(
            f"evaluated checkpoints {ev['evaluated']} (results in {out / 'eval'}, dashboard "
            f"{out / 'dashboard' / 'index.html'})"
        )
        for step, why in sorted(ev["skipped"].items()):
            console.print(f"[yellow]not evaluated[/]: step {step}: {rich_escape(why)}")


def print_evaluated(res: dict, console: Any) -> None:
    """What ``bloomline evaluate`` did: each task's mean, what was not evaluated and why (bad task
    data as an error line on stderr), and the languages that got worse."""
    console.print(
        f"[bold green]done[/]: step {res['step']}, {res['tokens']:,} tokens in {res['seconds']:.1f} s; "
        f"results in {res['results']}"
    )
    for t in res["tasks"]:
        console.print(f"{t['task']} {t['metric']}: {t['value']:.4f} (mean of {t['n']} languages)")
    for t in res["skipped"]:
        if str(t["note"]).startswith(("malformed record", "lm-eval failed")):  # bad task data: an error, the rest ran
            print(printable(f"error: {t['task']} {t['lang']} not evaluated, {t['note']}"), file=sys.stderr)
        else:
            what = rich_escape(f"{t['task']} {t['lang']}: {t['note']}")
            console.print(f"[yellow]not evaluated[/]: {what}", highlight=False)
    for g in res["regressions"]:
        console.print(f"[yellow]regression[/]: {g['lang']} bits per byte {g['previous_bpb']:.4f} → {g['bpb']:.4f}")
