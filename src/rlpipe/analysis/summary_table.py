"""The summary table as the report shows it (``results/summary/summary.html``): one row per
variant, each number formatted, 'n/a' where a variant did not measure it, never 'nan'."""

from __future__ import annotations

import math

import pandas as pd

from rlpipe import contract

TABLE_COLUMNS = {  # column -> (header, format)
    "variant": ("variant", "{}"), "mode": ("mode", "{}"),
    "val_reward_initial": ("val reward (step 0)", "{:.3f}"), "val_reward_final": ("val reward (final)", "{:.3f}"),
    "val_reward_best": ("val reward (best)", "{:.3f}"), "best_step": ("best step", "{:d}"),
    "wall_time_s": ("wall time (s)", "{:.1f}"), "total_samples": ("samples", "{:.0f}"),
    "samples_per_s": ("samples/s", "{:.2f}"), "speedup_vs_ref": ("speedup vs ref", "{:.2f}x"),
    "devices": ("devices", "{:.0f}"), "device_hours": ("device-hours", "{:.4f}"),
    "share_generate": ("generate %", "{:.0%}"), "share_update": ("update %", "{:.0%}"),
    "share_ref_logprobs": ("ref logprobs %", "{:.0%}"), "share_score": ("score %", "{:.0%}"),
    "share_weight_sync": ("weight sync %", "{:.0%}"), "share_validate": ("validate %", "{:.0%}"),
    "share_other": ("other %", "{:.0%}"),
    "kl_ref_final": ("KL ref (end)", "{:.4f}"), "kl_ref_k3_final": ("KL ref k3 (end)", "{:.4f}"),
    "kl_prev_final": ("KL prev (end)", "{:.5f}"), "kl_prev_k3_final": ("KL prev k3 (end)", "{:.5f}"),
    "sync_label": ("sync transport", "{}"), "sync_median_s": ("sync median (s)", "{:.4f}"),
    "overlap_bound": ("overlap bound", "{:.2f}x"), "overlap_achieved": ("overlap achieved", "{:.2f}x"),
    "bound_fraction": ("speedup / bound", "{:.0%}"),
    "load_avg_max": ("load avg (max)", "{:.2f}"), "other_cpu_frac": ("other processes' CPU %", "{:.0%}"),
    "contended": ("contended", "{}"),
    "prov_cpu_capability": ("CPU kernels", "{}"), "prov_torch": ("torch", "{}"), "prov_lock": ("lock", "{}"),
}


def _fmt(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    try:
        return fmt.format(int(value) if fmt == "{:d}" else value)
    except (ValueError, TypeError):
        return str(value)


def table_html(table: pd.DataFrame) -> str:
    """Formatted HTML summary table; missing values read 'n/a', never 'nan'."""
    headers = {c: h for c, (h, _) in TABLE_COLUMNS.items()}
    headers["device_hours"] = contract.device_hours_unit(table.get("device_type", ()))
    cols = [c for c in TABLE_COLUMNS if c in table.columns]
    shown = pd.DataFrame({headers[c]: [_fmt(v, TABLE_COLUMNS[c][1]) for v in table[c]] for c in cols})
    ref = table.attrs.get("reference", "onpolicy")
    body = shown.to_html(index=False, escape=True, border=0, classes="summary")
    note = (f"<p>Speedup = samples/s relative to <b>{ref}</b> (= its wall time / this wall time when both "
            "consumed the same samples). Device-hours = wall time x devices (GPU-hours on GPU runs). "
            "Shares are of the stacked phase time; 'n/a' = not measured for this variant. Contended: other "
            "processes took the run's CPU while it was timed (its timing comparisons are no finding).</p>")
    style = ("<style>table.summary{border-collapse:collapse;font:13px sans-serif}"
             "table.summary td,table.summary th{border:1px solid #ccc;padding:3px 6px;text-align:right}</style>")
    return f"<!doctype html><html><head><meta charset='utf-8'>{style}</head><body>{body}{note}</body></html>\n"
