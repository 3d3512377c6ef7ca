//! The hourly chart of unprotected writes, as a self-contained SVG (no scripts, no
//! external resources), built with maud so every text is escaped.

use std::time::SystemTime;

use maud::{html, Markup};

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 240.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 36.0;

/// `HH:00` in UTC.
fn hour_label(t: SystemTime) -> String {
    let s = humantime::format_rfc3339_seconds(t).to_string();
    s.get(11..16).unwrap_or("").to_owned()
}

/// An SVG bar chart of `(hour start, count)`, captioned with `caption`.
pub(crate) fn hourly_svg(caption: &str, hours: &[(SystemTime, i64)]) -> Markup {
    let max = hours.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let slot = plot_w / hours.len().max(1) as f64;
    let bar = (slot * 0.8).max(1.0);
    // About twelve hour labels, whatever the span.
    let every = hours.len().div_ceil(12).max(1);
    let total: i64 = hours.iter().map(|(_, n)| n).sum();
    html! {
        svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img"
            width=(WIDTH) height=(HEIGHT) viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } {
            title { (caption) }
            rect x="0" y="0" width=(WIDTH) height=(HEIGHT) fill="#ffffff" {}
            text x=(LEFT) y="18" font-family="sans-serif" font-size="13" fill="#222" {
                (caption) " (" (total) " in " (hours.len()) " h)"
            }
            line x1=(LEFT) y1=(TOP + plot_h) x2=(LEFT + plot_w) y2=(TOP + plot_h) stroke="#888" {}
            line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(TOP + plot_h) stroke="#888" {}
            text x=(LEFT - 6.0) y=(TOP + 4.0) text-anchor="end" font-family="sans-serif" font-size="11" fill="#444" { (max) }
            text x=(LEFT - 6.0) y=(TOP + plot_h) text-anchor="end" font-family="sans-serif" font-size="11" fill="#444" { "0" }
            @for (i, (hour, n)) in hours.iter().enumerate() {
                @let h = plot_h * (*n as f64) / (max as f64);
                @let x = LEFT + slot * i as f64 + (slot - bar) / 2.0;
                rect class="bar" x=(format!("{x:.1}")) y=(format!("{:.1}", TOP + plot_h - h)) width=(format!("{bar:.1}"))
                    height=(format!("{h:.1}")) fill="#c0392b" data-count=(n) {
                    title { (humantime::format_rfc3339_seconds(*hour)) ": " (n) " unprotected" }
                }
                @if i % every == 0 {
                    text x=(format!("{:.1}", LEFT + slot * i as f64 + slot / 2.0)) y=(HEIGHT - BOTTOM + 16.0)
                        text-anchor="middle" font-family="sans-serif" font-size="11" fill="#444" { (hour_label(*hour)) }
                }
            }
            text x=(LEFT + plot_w) y=(HEIGHT - 4.0) text-anchor="end" font-family="sans-serif" font-size="10" fill="#666" {
                "hours in UTC"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn bars_scale_to_the_busiest_hour_and_text_is_escaped() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000 / 3600 * 3600);
        let hours = [
            (t0, 2),
            (t0 + Duration::from_secs(3600), 0),
            (t0 + Duration::from_secs(7200), 4),
        ];
        let svg = hourly_svg("resource <script>alert(1)</script>", &hours).into_string();
        assert!(!svg.contains("<script>"));
        assert!(svg.contains("resource &lt;script&gt;alert(1)&lt;/script&gt;"));
        assert_eq!(svg.matches("class=\"bar\"").count(), 3);
        // Plot height 176: the busiest hour fills it, the first is half as tall.
        assert!(
            svg.contains("height=\"176.0\" fill=\"#c0392b\" data-count=\"4\""),
            "{svg}"
        );
        assert!(svg.contains("height=\"88.0\" fill=\"#c0392b\" data-count=\"2\""));
        assert!(svg.contains("(6 in 3 h)"));
    }
}
