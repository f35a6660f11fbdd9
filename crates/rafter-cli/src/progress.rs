//! A progress bar over the long steps of a command (import, optimise, plan, write).
//!
//! Drawn on stderr and only when stderr is a terminal: stdout stays clean for the lines
//! scripts read, and logs and pipes never see escape codes.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Steps of known count, each named as it starts.
pub struct Steps {
    bar: ProgressBar,
    start: Instant,
}

impl Steps {
    /// A bar of `total` steps; hidden unless stderr is a terminal.
    pub fn new(total: u64) -> Steps {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        let style = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:24.cyan/blue} {pos}/{len} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(100));
        Steps {
            bar,
            start: Instant::now(),
        }
    }

    /// Starts step `name`, counting the previous one (if any) as done.
    pub fn step(&self, name: &str) {
        if !self.bar.message().is_empty() {
            self.bar.inc(1);
        }
        self.bar.set_message(name.to_string());
    }

    /// Removes the bar and returns the time since it was created.
    pub fn finish(self) -> Duration {
        self.bar.finish_and_clear();
        self.start.elapsed()
    }
}

impl Drop for Steps {
    /// On an early return (an error), the bar must not stay on the screen above the message.
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}
