//! Lateness plots for the precision bench: per lane an empirical CDF of
//! lateness (x: ms, log scale from 1 ms to past the worst; y: fraction of
//! messages delivered within x) with dashed markers at p50, p90 and p99, and
//! one chart with every lane's CDF. PNG files written with `plotters`.
//!
//! Text needs a font: plotters' `ab_glyph` backend takes the font's bytes,
//! read here at run time from BENCH_PLOT_FONT or the usual places of DejaVu
//! Sans and Liberation Sans (no system font library is linked). With none,
//! the charts are drawn without any text, and the caller is told why.
//!
//! Nothing here panics on bad input or a failed write: every failure comes
//! back as an `Err` naming the file.
//!
//! The sweep bench draws its own charts with the same font, size, colours
//! and file handling ([`load_font`], [`write_png`]).

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One lane's measurements.
pub struct Lateness {
    /// What the table calls it: the strategy, or e.g. "cascade, this binary".
    pub label: String,
    /// Lateness per message in ms (delivered minus due), sorted ascending.
    pub sorted_ms: Vec<i64>,
    /// Bucket placements per delivered message; None where not counted.
    pub hops: Option<f64>,
}

/// What one call of [`write_all`] did.
pub struct Report {
    /// None: text drawn. Some(why): the charts have no text.
    pub no_text: Option<String>,
    /// Per file: its path, or what went wrong.
    pub files: Vec<Result<PathBuf, String>>,
}

/// Writes `lateness-<label>.png` per lane and `lateness-all.png` (every
/// lane) into `dir`, creating it.
pub fn write_all(dir: &Path, lanes: &[Lateness]) -> Report {
    let no_text = load_font().err();
    let text = no_text.is_none();
    let mut files = Vec::new();
    if let Err(e) = std::fs::create_dir_all(dir) {
        files.push(Err(format!("{}: {e}", dir.display())));
        return Report { no_text, files };
    }
    for lane in lanes {
        let path = dir.join(format!("lateness-{}.png", slug(&lane.label)));
        files.push(write_png(&path, |p| draw_one(p, lane, text)));
    }
    if lanes.len() > 1 {
        let path = dir.join("lateness-all.png");
        files.push(write_png(&path, |p| draw_all(p, lanes, text)));
    }
    Report { no_text, files }
}

/// The file name part for a label: "cascade, this binary" gives
/// "cascade-this-binary".
pub fn slug(label: &str) -> String {
    let mut out = String::new();
    for c in label.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() { "lane".into() } else { out }
}

pub type DrawResult = Result<(), Box<dyn Error>>;

/// Draws into a temporary file beside `path` and renames it into place, so a
/// failed drawing leaves no half-drawn PNG (and keeps an older one). A panic
/// inside plotters is caught and reported like any error.
pub fn write_png(path: &Path, draw: impl FnOnce(&Path) -> DrawResult) -> Result<PathBuf, String> {
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("plot");
    // The extension stays .png: plotters picks the encoder from it.
    let tmp = path.with_file_name(format!(".{name}.partial.png"));
    let drawn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| draw(&tmp)))
        .map_err(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            format!("panicked: {msg}")
        })
        .and_then(|r| r.map_err(|e| e.to_string()))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| e.to_string()));
    match drawn {
        Ok(()) => Ok(path.to_path_buf()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(format!("{}: {e}", path.display()))
        }
    }
}

pub const SIZE: (u32, u32) = (900, 560);
pub const FONT: &str = "sans-serif";
pub const CURVE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];
/// p50, p90, p99 and their markers' colours.
const MARKS: [(f64, &str, RGBColor); 3] = [
    (0.5, "p50", RGBColor(44, 160, 44)),
    (0.9, "p90", RGBColor(255, 127, 14)),
    (0.99, "p99", RGBColor(214, 39, 40)),
];

/// As the bench's table computes it: nearest rank, rounded.
fn percentile(sorted: &[i64], p: f64) -> i64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Registers a sans-serif font for plotters once per process: the file
/// BENCH_PLOT_FONT names, else the first DejaVu Sans or Liberation Sans found.
/// Err says why there is none.
pub fn load_font() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("BENCH_PLOT_FONT") {
                return register(Path::new(&path))
                    .map_err(|e| format!("BENCH_PLOT_FONT={}: {e}", Path::new(&path).display()));
            }
            for path in [
                "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/dejavu/DejaVuSans.ttf",
                "/usr/share/fonts/TTF/DejaVuSans.ttf",
                "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
                "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
                "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
            ] {
                if Path::new(path).exists() {
                    return register(Path::new(path)).map_err(|e| format!("{path}: {e}"));
                }
            }
            Err("no DejaVu Sans or Liberation Sans under /usr/share/fonts \
                 (set BENCH_PLOT_FONT to a .ttf file)"
                .into())
        })
        .clone()
}

fn register(path: &Path) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    // plotters keeps the font for the rest of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FONT, FontStyle::Normal, bytes)
        .map_err(|_| "not a font plotters can read".to_string())
}

/// Right end of the x axis: a little past the worst lateness, at least 10 ms.
fn x_end(lanes: &[&Lateness]) -> f64 {
    let worst = lanes
        .iter()
        .filter_map(|l| l.sorted_ms.last())
        .copied()
        .max()
        .unwrap_or(1);
    (worst as f64 * 1.3).max(10.0)
}

/// The empirical CDF as a step line: lateness at or under 1 ms (including
/// early deliveries) is drawn at 1 ms, the log axis' left end.
fn cdf_points(sorted: &[i64], x_end: f64) -> Vec<(f64, f64)> {
    let n = sorted.len() as f64;
    let mut i = sorted.iter().take_while(|v| **v <= 1).count();
    let mut points = vec![(1.0, i as f64 / n)];
    while i < sorted.len() {
        let v = sorted[i];
        let below = i as f64 / n;
        while i < sorted.len() && sorted[i] == v {
            i += 1;
        }
        points.push((v as f64, below));
        points.push((v as f64, i as f64 / n));
    }
    points.push((x_end, 1.0));
    points
}

/// Tick labels: "1 ms", "100 ms", "10 s"; on a short axis, where plotters
/// puts a tick at every whole ms, only 1, 2 and 5 times a power of ten are
/// labelled (the others would run into each other).
pub fn fmt_ms(v: &f64) -> String {
    let mantissa = v / 10f64.powf(v.log10().floor());
    if ![1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 1e-6) {
        return String::new();
    }
    if *v >= 1000.0 {
        format!("{:.0} s", v / 1000.0)
    } else {
        format!("{v:.0} ms")
    }
}

fn fmt_pct(v: &f64) -> String {
    format!("{:.0}%", v * 100.0)
}

fn hops_text(hops: Option<f64>) -> String {
    match hops {
        Some(h) => format!("{h:.2} hops/msg"),
        None => "hops/msg not counted".into(),
    }
}

fn check(lane: &Lateness) -> DrawResult {
    if lane.sorted_ms.is_empty() {
        return Err(format!("{}: no lateness measured", lane.label).into());
    }
    if lane.sorted_ms.windows(2).any(|w| w[0] > w[1]) {
        return Err(format!("{}: lateness not sorted", lane.label).into());
    }
    Ok(())
}

/// The chart: white background, optional title, log x axis from 1 ms to
/// `x_end`, y from 0 to 1, grid and (with text) tick labels and axis names.
fn axes<'a, 'b>(
    root: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    title: Option<String>,
    x_end: f64,
) -> Result<Chart<'a, 'b>, Box<dyn Error>> {
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(root);
    builder.margin(20);
    if let Some(title) = &title {
        builder
            .caption(title, (FONT, 22))
            .x_label_area_size(50)
            .y_label_area_size(64);
    }
    let mut chart = builder.build_cartesian_2d((1f64..x_end).log_scale(), 0f64..1.0)?;
    let mut mesh = chart.configure_mesh();
    if title.is_some() {
        mesh.x_desc("lateness (delivered minus due; at or under 1 ms drawn at 1 ms)")
            .y_desc("messages delivered within x")
            .x_label_formatter(&fmt_ms)
            .y_label_formatter(&fmt_pct)
            .y_labels(11)
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    Ok(chart)
}

type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<LogCoord<f64>, plotters::coord::types::RangedCoordf64>,
>;

/// The legend box, bottom right (under a CDF that part of the chart is empty).
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> DrawResult {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .margin(12)
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    Ok(())
}

fn legend_line(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2))
}

fn draw_one(path: &Path, lane: &Lateness, text: bool) -> DrawResult {
    check(lane)?;
    let late = &lane.sorted_ms;
    let x_end = x_end(&[lane]);
    let title = text.then(|| {
        let early = late.iter().filter(|v| **v < 0).count();
        let mut title = format!(
            "{}: lateness CDF, {} messages, {}",
            lane.label,
            late.len(),
            hops_text(lane.hops)
        );
        if early > 0 {
            title.push_str(&format!(", {early} early"));
        }
        title
    });
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    let mut chart = axes(&root, title, x_end)?;
    chart
        .draw_series(LineSeries::new(
            cdf_points(late, x_end),
            CURVE[0].stroke_width(2),
        ))?
        .label(format!("max {} ms", late[late.len() - 1]))
        .legend(legend_line(CURVE[0]));
    for (p, name, color) in MARKS {
        let v = percentile(late, p);
        let x = (v as f64).max(1.0);
        chart
            .draw_series(DashedLineSeries::new(
                [(x, 0.0), (x, 1.0)],
                6,
                4,
                color.stroke_width(2),
            ))?
            .label(format!("{name} {v} ms"))
            .legend(legend_line(color));
    }
    if text {
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

/// Every lane with data (a lane without is reported in its own file).
fn draw_all(path: &Path, lanes: &[Lateness], text: bool) -> DrawResult {
    let lanes: Vec<&Lateness> = lanes.iter().filter(|l| check(l).is_ok()).collect();
    if lanes.is_empty() {
        return Err("no lane has lateness to draw".into());
    }
    let x_end = x_end(&lanes);
    let title = text.then(|| {
        let counts: Vec<usize> = lanes.iter().map(|l| l.sorted_ms.len()).collect();
        let messages = if counts.iter().all(|c| *c == counts[0]) {
            format!("{} messages each", counts[0])
        } else {
            "messages per lane differ".into()
        };
        format!("lateness CDF per strategy, {messages}")
    });
    // The legend goes under the chart: inside, it would hide some curve.
    let rows = if text { lanes.len() as u32 } else { 0 };
    let root = BitMapBackend::new(path, (SIZE.0, SIZE.1 + 12 + 22 * rows)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(SIZE.1);
    let mut chart = axes(&top, title, x_end)?;
    let style = (FONT, 15).into_text_style(&bottom);
    for (k, lane) in lanes.iter().enumerate() {
        let late = &lane.sorted_ms;
        let color = CURVE[k % CURVE.len()];
        chart.draw_series(LineSeries::new(
            cdf_points(late, x_end),
            color.stroke_width(2),
        ))?;
        if text {
            let y = 10 + 22 * k as i32;
            let x = 84;
            bottom.draw(&PathElement::new(
                vec![(x, y), (x + 24, y)],
                color.stroke_width(2),
            ))?;
            let label = format!(
                "{}: p50 {} ms, p90 {} ms, p99 {} ms, max {} ms, {}",
                lane.label,
                percentile(late, 0.5),
                percentile(late, 0.9),
                percentile(late, 0.99),
                late[late.len() - 1],
                hops_text(lane.hops)
            );
            bottom.draw(&Text::new(
                label,
                (x + 32, y),
                style.pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
        }
    }
    root.present()?;
    Ok(())
}
