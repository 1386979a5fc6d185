//! Progress of long operations on stderr: a bar on a terminal, a plain line
//! every few seconds otherwise (logs, CI), nothing with `--json`.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// Progress of one phase.
pub(crate) struct Progress {
    label: String,
    bar: Option<ProgressBar>,
    plain: bool,
    done: u64,
    last_line: Instant,
}

impl Progress {
    /// Whether a bar would be drawn (worth counting the total first).
    pub(crate) fn interactive(json: bool) -> bool {
        !json && std::io::stderr().is_terminal()
    }

    /// Starts a phase; `total` gives a bar, `None` a spinner.
    pub(crate) fn start(label: &str, total: Option<u64>, json: bool) -> Self {
        let bar = Self::interactive(json).then(|| {
            let bar = match total {
                Some(total) => ProgressBar::new(total).with_style(
                    ProgressStyle::with_template(
                        "{msg} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})",
                    )
                    .expect("a valid template")
                    .progress_chars("=> "),
                ),
                None => ProgressBar::new_spinner().with_style(
                    ProgressStyle::with_template("{spinner} {msg}: {pos} ({per_sec})")
                        .expect("a valid template"),
                ),
            };
            bar.set_message(label.to_owned());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self {
            label: label.to_owned(),
            bar,
            plain: !json,
            done: 0,
            last_line: Instant::now(),
        }
    }

    /// Records `n` more items done.
    pub(crate) fn inc(&mut self, n: u64) {
        self.done += n;
        if let Some(bar) = &self.bar {
            bar.inc(n);
        } else if self.plain && self.last_line.elapsed() >= PLAIN_EVERY {
            eprintln!("{}: {} so far", self.label, self.done);
            self.last_line = Instant::now();
        }
    }

    /// Ends the phase (clears the bar; the caller prints the result).
    pub(crate) fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
