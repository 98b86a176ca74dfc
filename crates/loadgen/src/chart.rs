//! `linerate chart`: the per-second timelines of several `linerate bench --json`
//! runs on one SVG, a panel per figure and a line per run, so runs of two servers
//! under the same load can be compared at a glance (no font files needed).
//!
//! Each run is `LABEL=BENCH.json`, optionally `,SAMPLES` : a file of the server's
//! own figures, one line per sample, `t_s cpu_s rss_mib` (seconds since the bench
//! started, the server's CPU seconds used since then, its resident memory). With
//! samples, two more panels show the server's CPU (in cores busy) and its RSS.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use plotters::prelude::*;

#[derive(Args, Debug)]
pub struct ChartArgs {
    /// The SVG file to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// A title over the panels.
    #[arg(long, default_value = "")]
    title: String,
    /// `LABEL=BENCH.json[,SAMPLES]`, once per run to draw (at most 6).
    #[arg(required = true, num_args = 1..=6, value_name = "RUN")]
    runs: Vec<String>,
}

/// (second, value) points.
type Series = Vec<(f64, f64)>;

/// One run's series.
struct Run {
    label: String,
    gbps: Series,
    playing: Series,
    stalled: Series,
    ttfb_p99_ms: Series,
    cpu_cores: Series,
    rss_mib: Series,
}

pub fn run(args: ChartArgs) -> anyhow::Result<()> {
    let runs = args.runs.iter().map(|r| load(r)).collect::<anyhow::Result<Vec<_>>>()?;
    draw(&args.out, &args.title, &runs)?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

fn load(spec: &str) -> anyhow::Result<Run> {
    let Some((label, files)) = spec.split_once('=') else {
        bail!("run `{spec}`: expected LABEL=BENCH.json[,SAMPLES]");
    };
    let (json, samples) = match files.split_once(',') {
        Some((j, s)) => (j, Some(s)),
        None => (files, None),
    };
    let text = std::fs::read_to_string(json).with_context(|| format!("reading {json}"))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{json}: not JSON"))?;
    let Some(timeline) = v["timeline"].as_array() else {
        bail!("{json}: no `timeline` (write it with `linerate bench --json`)");
    };
    let series = |key: &str| -> Series {
        timeline.iter().filter_map(|s| Some((s["t_s"].as_f64()? + 0.5, s[key].as_f64()?))).collect()
    };
    let mut run = Run {
        label: label.to_string(),
        gbps: series("gbps"),
        playing: series("sessions_playing"),
        stalled: series("sessions_stalled"),
        ttfb_p99_ms: series("ttfb_p99_ms"),
        cpu_cores: Vec::new(),
        rss_mib: Vec::new(),
    };
    if run.gbps.is_empty() {
        bail!("{json}: the timeline is empty");
    }
    if let Some(path) = samples {
        (run.cpu_cores, run.rss_mib) = read_samples(Path::new(path))?;
    }
    Ok(run)
}

/// `t_s cpu_s rss_mib` lines: CPU as cores busy between samples, and RSS.
fn read_samples(path: &Path) -> anyhow::Result<(Series, Series)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<f64> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>().map_err(|_| {
            anyhow::anyhow!("{}: line {}: expected three numbers `t_s cpu_s rss_mib`", path.display(), n + 1)
        })?;
        if f.len() != 3 {
            bail!("{}: line {}: expected three numbers `t_s cpu_s rss_mib`", path.display(), n + 1);
        }
        rows.push((f[0], f[1], f[2]));
    }
    let cpu = rows
        .windows(2)
        .filter(|w| w[1].0 > w[0].0)
        .map(|w| ((w[0].0 + w[1].0) / 2.0, (w[1].1 - w[0].1).max(0.0) / (w[1].0 - w[0].0)))
        .collect();
    let rss = rows.iter().map(|r| (r.0, r.2)).collect();
    Ok((cpu, rss))
}

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

fn draw(path: &Path, title: &str, runs: &[Run]) -> anyhow::Result<()> {
    type Pick = fn(&Run) -> &Series;
    let mut panels: Vec<(&str, Pick)> = vec![
        ("Gb/s (client)", |r| &r.gbps),
        ("sessions playing", |r| &r.playing),
        ("sessions rebuffering", |r| &r.stalled),
        ("TTFB p99 (ms)", |r| &r.ttfb_p99_ms),
    ];
    if runs.iter().any(|r| !r.cpu_cores.is_empty()) {
        panels.push(("server CPU (cores)", |r| &r.cpu_cores));
        panels.push(("server RSS (MiB)", |r| &r.rss_mib));
    }
    let rows = panels.len().div_ceil(2);
    let root = SVGBackend::new(path, (1100, 60 + 260 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let end_s = runs.iter().flat_map(|r| r.gbps.last()).map(|p| p.0 + 0.5).fold(1.0, f64::max);
    for (area, (name, pick)) in root.split_evenly((rows, 2)).iter().zip(&panels) {
        let top = runs.iter().flat_map(|r| pick(r).iter().map(|p| p.1)).fold(0.0, f64::max);
        let top = if top > 0.0 { top * 1.1 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(*name, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..end_s, 0.0..top)?;
        chart.configure_mesh().x_desc("time (s)").max_light_lines(2).draw()?;
        for (i, r) in runs.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            chart
                .draw_series(LineSeries::new(pick(r).iter().copied(), colour.stroke_width(2)))?
                .label(r.label.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_become_cores_busy_and_rss() {
        let dir = std::env::temp_dir().join(format!("linerate-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("s.tsv");
        std::fs::write(&f, "0 0 10\n1 0.5 12\n3 2.5 20\n").unwrap();
        let (cpu, rss) = read_samples(&f).unwrap();
        assert_eq!(cpu, vec![(0.5, 0.5), (2.0, 1.0)]);
        assert_eq!(rss, vec![(0.0, 10.0), (1.0, 12.0), (3.0, 20.0)]);
        std::fs::write(&f, "0 0\n").unwrap();
        assert!(read_samples(&f).unwrap_err().to_string().contains("line 1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_chart_has_a_line_per_run_in_every_panel() {
        let dir = std::env::temp_dir().join(format!("linerate-chart-svg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bench = |gbps: f64| {
            let timeline: Vec<_> = (0..5)
                .map(|t| {
                    serde_json::json!({"t_s": t, "gbps": gbps, "sessions_playing": 10.0,
                        "sessions_stalled": 0.0, "ttfb_p99_ms": 2.5})
                })
                .collect();
            serde_json::json!({ "timeline": timeline }).to_string()
        };
        std::fs::write(dir.join("a.json"), bench(1.0)).unwrap();
        std::fs::write(dir.join("b.json"), bench(2.0)).unwrap();
        std::fs::write(dir.join("b.tsv"), "0 0 10\n1 0.5 12\n2 1.0 13\n").unwrap();
        let out = dir.join("c.svg");
        let spec = |l: &str, rest: &str| format!("{l}={}", dir.join(rest).display());
        run(ChartArgs {
            out: out.clone(),
            title: "t".into(),
            runs: vec![
                spec("nginx", "a.json"),
                format!("{},{}", spec("linerate", "b.json"), dir.join("b.tsv").display()),
            ],
        })
        .unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
        for label in ["nginx", "linerate", "server RSS (MiB)", "TTFB p99 (ms)"] {
            assert!(svg.contains(label), "no {label} in the chart");
        }
        // Six panels, two runs each (the nginx run has no samples: empty lines there).
        // Six panels with a legend entry per run; a line per run and panel, except
        // that the nginx run has no samples for the CPU and RSS panels.
        let strokes = |c: &str| svg.matches(&format!("stroke=\"{c}\"")).count();
        assert_eq!(strokes("#D62728"), 6 + 6, "linerate: lines and legend entries");
        assert_eq!(strokes("#1F77B4"), 4 + 6, "nginx: lines and legend entries");
        assert!(load(&spec("x", "missing.json")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
