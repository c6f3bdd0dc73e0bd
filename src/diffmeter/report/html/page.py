"""The report as one self-contained HTML page: Plotly's script, every figure, the images and the
sortable summary table embedded, so it opens offline with no request anywhere."""

from __future__ import annotations

import html
from datetime import datetime, timezone

from diffmeter import __version__, units
from diffmeter.measure.speedup import within_noise_rule
from diffmeter.report import outputs
from diffmeter.report.html import figures as plots
from diffmeter.report.html.gallery import gallery_html
from diffmeter.report.html.study import WEIGHTS_LABELS, Run, Study
from diffmeter.report.run_table import host_link_line
from diffmeter.report.speedup_text import coverage_line, noise_lines, scaling_cell, speedup_cell

#: (column of `diffmeter table`, header, how to show a value)
SUMMARY = (
    ("model", "model", str),
    ("weights", "weights", str),
    ("width", "width (px)", str),
    ("height", "height (px)", str),
    ("frames", "frames", str),
    ("batch", "batch", str),
    ("steps", "steps", str),
    ("dtype", "dtype", str),
    ("hardware", "hardware", str),
    ("optimizations", "optimizations", lambda v: v or "none"),
    ("settings", "other settings", lambda v: v.replace("+", ", ") or "none"),  # shown where a run has some
    ("parallel", "parallel", lambda v: v or "one process"),  # shown where a run used several
    ("scaling_efficiency", "scaling", str),  # scaling_cell: the speed-up over the one-device run, its share
    ("status", "status", str),
    ("s_per_image", "time / {word} (median)", units.seconds),
    ("images_per_s", "{word}s / s (mean)", units.figure),  # outputs.rate: "videos" beside images
    ("speedup", "speed-up", str),  # speedup_cell: its interval and verdict, never a bare factor
    ("psnr_db", "PSNR", lambda v: f"{v:.2f} dB"),  # "identical" where every image is
    ("ssim", "SSIM", lambda v: f"{v:.4f}"),
    ("peak_cuda_bytes", "peak CUDA memory", units.gib),
    ("peak_rss_bytes", "peak RSS", units.gib),
    ("gpu_j_per_image", "GPU energy / {word}", units.joules),
    ("tflops_per_image", "compute / {word}", lambda v: units.flops(v * 1e12)),  # sorted by data-value: TFLOPs
    ("mfu", "MFU", lambda v: f"{v:.1%}"),
)

SECTIONS = plots.SECTIONS

STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 24px; color: #222; }
h1 { margin-bottom: 4px; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 36px; }
.meta { color: #555; } .warning { background: #fff4e5; border-left: 4px solid #f58518; padding: 8px 12px; }
table.summary { border-collapse: collapse; font-size: 13px; width: 100%; display: block; overflow-x: auto; }
table.summary th { cursor: pointer; background: #f3f3f3; position: sticky; top: 0; white-space: nowrap; }
table.summary th, table.summary td, table.ops th, table.ops td { border: 1px solid #ddd; padding: 4px 6px;
    text-align: right; white-space: nowrap; }
table.ops { border-collapse: collapse; font-size: 12px; margin: 0 0 8px 60px; } table.ops th { background: #f3f3f3; }
table.summary td.text, table.ops td.text { text-align: left; } tr.failed td { color: #b00; }
th.sorted-asc::after { content: " \\25B2"; } th.sorted-desc::after { content: " \\25BC"; }
.plot { margin: 18px 0 6px; } .caption { color: #555; font-size: 13px; margin: 0 0 18px; }
.pairs { display: flex; flex-wrap: wrap; gap: 16px; } .pair { margin: 0; }
.shot { display: inline-block; margin-right: 4px; text-align: center; font-size: 12px; color: #555; }
.thumb { width: 192px; cursor: zoom-in; image-rendering: pixelated; border: 1px solid #ccc; }
figcaption { font-size: 12px; max-width: 400px; } .prompt { color: #777; }
.tag { font-size: 12px; font-weight: normal; color: #a55; }
#lightbox { display: none; position: fixed; inset: 0; background: rgba(0,0,0,.85); align-items: center;
            justify-content: center; cursor: zoom-out; } #lightbox img { max-width: 95vw; max-height: 95vh; }
"""

SORT_SCRIPT = """
document.querySelectorAll('table.summary th').forEach((th, column) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0];
  const ascending = !th.classList.contains('sorted-asc');
  th.closest('tr').querySelectorAll('th').forEach(h => h.classList.remove('sorted-asc', 'sorted-desc'));
  th.classList.add(ascending ? 'sorted-asc' : 'sorted-desc');
  const key = row => row.cells[column].dataset.value;
  const rows = Array.from(body.rows).sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === '' || y === '') return (x === '') - (y === '');
    const both = !isNaN(x) && !isNaN(y);
    const order = both ? Number(x) - Number(y) : x.localeCompare(y);
    return ascending ? order : -order;
  });
  rows.forEach(row => body.appendChild(row));
}));
"""
SCRIPT = (
    SORT_SCRIPT
    + """
const lightbox = document.getElementById('lightbox');
document.querySelectorAll('img.thumb').forEach(img => img.addEventListener('click', () => {
  lightbox.querySelector('img').src = img.dataset.full; lightbox.style.display = 'flex';
}));
lightbox.addEventListener('click', () => { lightbox.style.display = 'none'; });
"""
)


def render(study: Study, title: str, images_per_run: int = 4) -> str:
    """The whole page."""
    from plotly.offline import get_plotlyjs

    body = [f"<h1>{html.escape(title)}</h1>", _header(study)]
    if study.runs:
        body += ['<h2 id="summary">Summary</h2>', _summary(study.runs)]
    for anchor, heading, builder in SECTIONS:
        built = builder(study)
        # the images come right after their quality figures
        gallery = gallery_html(study, images_per_run) if anchor == "tradeoffs" else ""
        if not built and not gallery:
            continue
        body.append(f'<h2 id="{anchor}">{heading}</h2>')
        body += [_figure(figure) for figure in built]
        if gallery:
            body += [
                '<h2 id="images">Images</h2>',
                '<p class="caption">Lossy runs: each unoptimized image (left) beside the optimized one at the same '
                "seed and prompt (right), with their PSNR and SSIM. Click an image for full size.</p>",
                gallery,
            ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>{''.join(body)}"
        "<div id='lightbox'><img alt='full size'></div>"
        f"<script>{SCRIPT}</script></body></html>"
    )


def _header(study: Study) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f'<p class="meta">{units.counted(len(study.runs), "run")}, {units.counted(len(study.ladders), "ladder")}, '
        f"{units.counted(len(study.profiles), 'profile')} "
        f"from <code>{html.escape(str(study.root))}</code>; built {now} by diffmeter {__version__}.</p>"
    ]
    weights = {run.weights for run in study.runs}
    if weights - {"pretrained"}:
        kinds = ", ".join(WEIGHTS_LABELS[w] for w in sorted(weights - {"pretrained"}))
        parts.append(
            f'<p class="warning">This study holds runs with {html.escape(kinds)}: their timings are real for '
            "that architecture and size, their images are noise, and tiny pipelines say nothing about real "
            "models' speed. Every plot that shows them says so in its title.</p>"
        )
    failed = [run for run in study.runs if run.result.status != "complete"]
    if failed:
        parts.append(
            f'<p class="meta">{units.counted(len(failed), "failed run")} listed in the summary with their errors '
            "(hover a red row).</p>"
        )
    return "".join(parts)


def _summary(runs: list[Run]) -> str:
    word = outputs.noun([run.row for run in runs])  # image, video, or output where both are there
    videos = any(outputs.is_video(run.row) for run in runs)
    parallel = any(run.row["processes"] > 1 for run in runs)
    hidden = {"frames"} if not videos else set()
    hidden |= {"parallel", "scaling_efficiency"} if not parallel else set()
    hidden |= {"settings"} if not any(run.row["settings"] for run in runs) else set()
    columns = [column for column in SUMMARY if column[0] not in hidden]  # no empty frames, parallel or settings
    head = "".join(f"<th>{html.escape(header.format(word=word))}</th>" for _, header, _ in columns)
    rows = []
    for run in sorted(runs, key=lambda run: run.row["folder"]):
        cells = []
        for column, _, show in columns:
            value = run.row[column]
            text = "-" if value is None else show(value)
            sort = "" if value is None else html.escape(str(value), quote=True)
            if column == "psnr_db" and value is None and run.row["identical_images"]:
                text, sort = "identical", "Infinity"  # infinite PSNR: above every finite one, not with the missing
            if column == "speedup":
                text = speedup_cell(run.row)
            if column == "scaling_efficiency":
                text = scaling_cell(run.row)
            if column == "images_per_s" and value is not None:
                text = outputs.rate(value, outputs.is_video(run.row), word == "output")
            if column == "s_per_image" and value is not None and noise_lines([run.row]):
                text += " (noisy)"
            kind = "" if isinstance(value, (int, float)) else ' class="text"'
            cells.append(f'<td{kind} data-value="{sort}">{html.escape(text)}</td>')
        error = html.escape(run.row["error"] or "", quote=True)
        css = ' class="failed"' if run.result.status != "complete" else ""
        rows.append(f'<tr{css} title="{error or html.escape(run.row["folder"], quote=True)}">{"".join(cells)}</tr>')
    noisy = "".join(f"<li>{html.escape(line)}</li>" for line in noise_lines([run.row for run in runs]))
    links = [(run.row["folder"], line) for run in runs if (line := host_link_line(run.result))]
    linked = "".join(f"<li>{html.escape(folder)}: {html.escape(line)}</li>" for folder, line in sorted(links))
    return (
        f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
        + (f'<p class="caption">Noisy timings (marked "(noisy)"):</p><ul class="caption">{noisy}</ul>' if noisy else "")
        + (
            f'<p class="caption">Offloaded runs, timed over their host link:</p><ul class="caption">{linked}</ul>'
            if linked
            else ""
        )
        + '<p class="caption">Click a header to sort. Times are medians over the measured calls; speed-up per '
        f"{word} against the unoptimized run of the same settings (on CUDA the --no-tf32 run where one was measured, "
        "else TF32 alone; a ladder's rungs: against the ladder's baseline), "
        "the Hodges-Lehmann estimate over every pair of calls with its exact Mann-Whitney interval, within noise "
        f"when {within_noise_rule()}; PSNR/SSIM against its images at the same "
        f"seeds. {html.escape(coverage_line([run.row for run in runs]) or '')} Hover a row "
        "for its folder (or a failed run's error). Weights: pretrained, random (real size) or tiny-random (a "
        f"test pipeline). {html.escape(outputs.explained(word))} The same table: <code>diffmeter table DIR</code>.</p>"
    )


def _figure(figure: plots.Figure) -> str:
    div = figure.figure.to_html(
        full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True}
    )
    return f'<div class="plot">{div}</div>{figure.table}<p class="caption">{html.escape(figure.caption)}</p>'
