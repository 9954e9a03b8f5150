//! SVG line charts of benchmark figures against cluster size, for `bench proxy --out`. Pure:
//! series in, SVG text out.
//!
//! Written by hand: plotters (the field's crate) needs a font file to lay out its labels, and
//! none is on our test machine; a chart of a few log-scaled lines is a hundred lines of SVG whose
//! text the viewer lays out.

use std::fmt::Write;

/// One line of a chart: its name and its points `(x, y)`, both positive.
pub struct Series {
    /// The legend's text.
    pub name: String,
    /// The points, in x order.
    pub points: Vec<(f64, f64)>,
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 400.0;
/// Plot area margins: left, right, top, bottom.
const MARGIN: (f64, f64, f64, f64) = (80.0, 170.0, 40.0, 50.0);
const COLOURS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

/// The powers of ten spanning `lo..=hi` (at least two), as a log axis' range and ticks.
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let lo = lo.log10().floor();
    let hi = hi.log10().ceil().max(lo + 1.0);
    (lo, hi)
}

/// A tick label: 1, 10, 1k, 10k, 1M ... or 0.1, 0.01 ...
fn tick(exp: f64) -> String {
    let value = 10f64.powf(exp);
    match exp as i32 {
        e if e >= 6 => format!("{}M", value / 1e6),
        e if e >= 3 => format!("{}k", value / 1e3),
        e if e >= 0 => format!("{value}"),
        e => format!("{:.*}", (-e) as usize, value),
    }
}

/// Escapes text for an SVG text node or attribute.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A log-log line chart of `series` titled `title`, the x axis labelled `x_label`, the y axis
/// `y_label`. Points that are not positive and finite are left out.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let valid = |(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && *x > 0.0 && *y > 0.0;
    let points: Vec<(f64, f64)> = series.iter().flat_map(|s| s.points.iter().copied()).filter(valid).collect();
    let (min_x, max_x) = points.iter().fold((f64::MAX, f64::MIN), |(lo, hi), (x, _)| (lo.min(*x), hi.max(*x)));
    let (min_y, max_y) = points.iter().fold((f64::MAX, f64::MIN), |(lo, hi), (_, y)| (lo.min(*y), hi.max(*y)));
    let ((x0, x1), (y0, y1)) =
        if points.is_empty() { ((0.0, 1.0), (0.0, 1.0)) } else { (decades(min_x, max_x), decades(min_y, max_y)) };
    let (left, right, top, bottom) = MARGIN;
    let (w, h) = (WIDTH - left - right, HEIGHT - top - bottom);
    let px = |x: f64| left + (x.log10() - x0) / (x1 - x0) * w;
    let py = |y: f64| top + h - (y.log10() - y0) / (y1 - y0) * h;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        left + w / 2.0,
        escape(title)
    );
    for exp in (x0 as i32)..=(x1 as i32) {
        let x = left + (f64::from(exp) - x0) / (x1 - x0) * w;
        let _ = writeln!(svg, r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{}" stroke="#ddd"/>"##, top + h);
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            top + h + 16.0,
            tick(f64::from(exp))
        );
    }
    for exp in (y0 as i32)..=(y1 as i32) {
        let y = top + h - (f64::from(exp) - y0) / (y1 - y0) * h;
        let _ = writeln!(svg, r##"<line x1="{left}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/>"##, left + w);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y + 4.0,
            tick(f64::from(exp))
        );
    }
    let _ = writeln!(svg, r#"<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="black"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        left + w / 2.0,
        HEIGHT - 12.0,
        escape(x_label)
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
        top + h / 2.0,
        escape(y_label)
    );
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> =
            s.points.iter().filter(|p| valid(p)).map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        for point in &points {
            let (x, y) = point.split_once(',').unwrap_or_default();
            let _ = writeln!(svg, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
        }
        let ly = top + 10.0 + 20.0 * i as f64;
        let lx = left + w + 12.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"/>"#,
            lx + 20.0
        );
        let _ = writeln!(svg, r#"<text x="{}" y="{}">{}</text>"#, lx + 26.0, ly + 4.0, escape(&s.name));
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, points: &[(f64, f64)]) -> Series {
        Series { name: name.into(), points: points.to_vec() }
    }

    /// The `points` attribute of every polyline, parsed.
    fn polylines(svg: &str) -> Vec<Vec<(f64, f64)>> {
        svg.lines()
            .filter_map(|l| l.strip_prefix("<polyline")?.split("points=\"").nth(1)?.split('"').next())
            .map(|points| {
                points
                    .split_whitespace()
                    .map(|p| {
                        let (x, y) = p.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn lines_are_placed_on_log_axes_inside_the_plot_area() {
        let svg = line_chart(
            "one endpoint change",
            "Services",
            "ms",
            &[
                series("nftables", &[(1.0, 0.03), (1000.0, 0.05), (50000.0, 0.06)]),
                series("iptables <legacy>", &[(1.0, 2.3), (1000.0, 139.0), (10000.0, 1869.0)]),
            ],
        );
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        let lines = polylines(&svg);
        assert_eq!(lines.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3]);
        let (left, right, top, bottom) = MARGIN;
        for &(x, y) in lines.iter().flatten() {
            assert!((left..=WIDTH - right).contains(&x) && (top..=HEIGHT - bottom).contains(&y), "{x},{y}");
        }
        // x: 1 .. 100k is five decades; 1,000 Services sit at 3/5 of the width.
        assert!((lines[0][1].0 - (left + 0.6 * (WIDTH - left - right))).abs() < 0.2);
        // Higher values are drawn higher (smaller y).
        assert!(lines[1][2].1 < lines[1][1].1 && lines[1][1].1 < lines[1][0].1);
        // Ticks from 0.01 to 10k on y, 1 to 100k on x; labels escaped.
        for label in [">0.01<", ">10k<", ">1<", ">100k<", "iptables &lt;legacy&gt;"] {
            assert!(svg.contains(label), "{label} in {svg}");
        }
    }

    #[test]
    fn points_that_cannot_be_drawn_are_left_out() {
        let svg = line_chart("t", "x", "y", &[series("a", &[(0.0, 1.0), (10.0, f64::NAN), (10.0, 5.0), (100.0, 0.0)])]);
        assert_eq!(polylines(&svg), [vec![polylines(&svg)[0][0]]]);
        let empty = line_chart("t", "x", "y", &[]);
        assert!(empty.ends_with("</svg>\n") && polylines(&empty).is_empty());
    }
}
