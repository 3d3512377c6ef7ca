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

/// The colours of the findings, in `FINDINGS` order (missing, malformed, stale, store
/// unavailable).
pub(crate) const FINDING_COLOURS: [&str; 4] = ["#c0392b", "#e67e22", "#8e44ad", "#7f8c8d"];

/// An SVG chart of hours stacked by finding: each bar is an hour, its segments the
/// counts of `FINDINGS` in order from the bottom, with a legend.
pub(crate) fn stacked_svg(
    caption: &str,
    names: [&str; 4],
    hours: &[(SystemTime, [i64; 4])],
) -> Markup {
    let max = hours
        .iter()
        .map(|(_, n)| n.iter().sum::<i64>())
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let slot = plot_w / hours.len().max(1) as f64;
    let bar = (slot * 0.8).max(1.0);
    let every = hours.len().div_ceil(12).max(1);
    let total: i64 = hours.iter().map(|(_, n)| n.iter().sum::<i64>()).sum();
    html! {
        svg xmlns="http://www.w3.org/2000/svg" class="chart stacked" role="img"
            width=(WIDTH) height=(HEIGHT) viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } {
            title { (caption) }
            rect x="0" y="0" width=(WIDTH) height=(HEIGHT) fill="#ffffff" {}
            text x=(LEFT) y="18" font-family="sans-serif" font-size="13" fill="#222" {
                (caption) " (" (total) " in " (hours.len()) " h)"
            }
            @for (i, name) in names.iter().enumerate() {
                @let x = WIDTH - RIGHT - 150.0 * (4 - i) as f64;
                rect x=(x) y="8" width="10" height="10" fill=(FINDING_COLOURS[i]) {}
                text x=(x + 14.0) y="17" font-family="sans-serif" font-size="11" fill="#444" { (name) }
            }
            line x1=(LEFT) y1=(TOP + plot_h) x2=(LEFT + plot_w) y2=(TOP + plot_h) stroke="#888" {}
            line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(TOP + plot_h) stroke="#888" {}
            text x=(LEFT - 6.0) y=(TOP + 4.0) text-anchor="end" font-family="sans-serif" font-size="11" fill="#444" { (max) }
            text x=(LEFT - 6.0) y=(TOP + plot_h) text-anchor="end" font-family="sans-serif" font-size="11" fill="#444" { "0" }
            @for (i, (hour, counts)) in hours.iter().enumerate() {
                @let x = LEFT + slot * i as f64 + (slot - bar) / 2.0;
                @let mut base = TOP + plot_h;
                @for (f, n) in counts.iter().enumerate() {
                    @if *n > 0 {
                        @let h = plot_h * (*n as f64) / (max as f64);
                        @let y = { base -= h; base };
                        rect class={ "seg seg-" (f) } x=(format!("{x:.1}")) y=(format!("{y:.1}")) width=(format!("{bar:.1}"))
                            height=(format!("{h:.1}")) fill=(FINDING_COLOURS[f]) data-count=(n) {
                            title { (humantime::format_rfc3339_seconds(*hour)) ": " (n) " " (names[f]) }
                        }
                    }
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

    #[test]
    fn stacked_segments_sit_on_each_other_and_scale_to_the_busiest_hour() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000 / 3600 * 3600);
        let hours = [
            (t0, [2, 0, 2, 0]),
            (t0 + Duration::from_secs(3600), [0, 0, 0, 0]),
            (t0 + Duration::from_secs(7200), [1, 1, 0, 0]),
        ];
        let svg = stacked_svg("by finding", ["a", "b", "c", "<d>"], &hours).into_string();
        assert_eq!(svg.matches("class=\"seg ").count(), 4, "{svg}");
        // Plot from y 28 to 204 (176 high); the busiest hour (4) fills it: its first
        // segment (2) from 116 to 204, the third on top of it from 28 to 116.
        assert!(
            svg.contains("class=\"seg seg-0\" x=\"78.0\" y=\"116.0\""),
            "{svg}"
        );
        assert!(svg.contains("y=\"28.0\" width=\"240.0\" height=\"88.0\" fill=\"#8e44ad\""));
        assert!(svg.contains("&lt;d&gt;") && svg.contains("(6 in 3 h)"));
    }
}
