//! The profile-over-time chart of a phased run, as SVG (no font files needed).

use std::path::Path;

use plotters::prelude::*;

/// One panel: a title and the (time ns, profile index) steps of one policy.
pub(crate) struct Series<'a> {
    pub title: &'a str,
    pub trace: &'a [(u64, usize)],
}

/// Draws one panel per series, stacked, sharing the time axis. `phases` are
/// (start ns, end ns, label) spans shaded behind the steps.
pub(crate) fn write_profile_chart(
    path: &Path,
    series: &[Series<'_>],
    phases: &[(u64, u64, &str)],
    end_ns: u64,
    profile_labels: &[String],
) -> anyhow::Result<()> {
    let height = 40 + 220 * series.len() as u32;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((series.len(), 1));
    let end_s = end_ns as f64 / 1e9;
    let top = profile_labels.len().saturating_sub(1) as f64;
    for (panel, s) in panels.iter().zip(series) {
        let mut chart = ChartBuilder::on(panel)
            .caption(s.title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(90)
            .build_cartesian_2d(0.0..end_s, -0.3..top + 0.3)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_labels(profile_labels.len())
            .y_label_formatter(&|y| {
                let i = y.round();
                if (y - i).abs() < 0.01 && i >= 0.0 {
                    profile_labels.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .disable_y_mesh()
            .draw()?;
        let shades = [RGBColor(230, 240, 255), RGBColor(255, 236, 220)];
        for (i, (from, to, label)) in phases.iter().enumerate() {
            let (a, b) = (*from as f64 / 1e9, *to as f64 / 1e9);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(a, -0.3), (b, top + 0.3)],
                shades[i % shades.len()].filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                label.to_string(),
                (a + 0.02, top + 0.15),
                ("sans-serif", 14),
            )))?;
        }
        // Steps: hold each index until the next change.
        let mut points = Vec::with_capacity(s.trace.len() * 2 + 1);
        for (i, &(t, idx)) in s.trace.iter().enumerate() {
            let x = t as f64 / 1e9;
            if i > 0 {
                points.push((x, s.trace[i - 1].1 as f64));
            }
            points.push((x, idx as f64));
        }
        if let Some(&(_, last)) = s.trace.last() {
            points.push((end_s, last as f64));
        }
        chart.draw_series(LineSeries::new(points, BLUE.stroke_width(2)))?;
    }
    root.present()?;
    Ok(())
}
