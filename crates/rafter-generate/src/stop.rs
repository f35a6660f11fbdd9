//! Stop strings: ending generation at a string that may span tokens, and holding back text
//! that could still turn out to be the start of one, so that nothing after a stop string is
//! ever emitted, not even in a stream.

/// Matches stop strings over generated text as it streams in.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    text: String,
    emitted: usize,
    hit: bool,
}

/// What one [`StopStrings::push`] lets through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Text safe to emit now.
    pub text: String,
    /// A stop string was completed: `text` ends right before it, and nothing follows.
    pub stopped: bool,
}

impl StopStrings {
    /// Empty stop strings are ignored.
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Self {
        StopStrings {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            ..Default::default()
        }
    }

    /// Adds generated text; returns what may be emitted.
    pub fn push(&mut self, piece: &str) -> Released {
        if self.hit {
            return Released {
                text: String::new(),
                stopped: true,
            };
        }
        self.text.push_str(piece);
        // A stop string can only begin in the held-back tail (see `hold`), so search there.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.text[self.emitted..].find(s.as_str()))
            .min();
        if let Some(at) = first {
            let end = self.emitted + at;
            let out = self.text[self.emitted..end].to_string();
            self.text.truncate(end);
            self.emitted = end;
            self.hit = true;
            return Released {
                text: out,
                stopped: true,
            };
        }
        let keep = self.hold();
        let end = self.text.len() - keep;
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        Released {
            text: out,
            stopped: false,
        }
    }

    /// The longest tail of the unemitted text that is a proper prefix of a stop string.
    fn hold(&self) -> usize {
        let pending = &self.text[self.emitted..];
        let mut best = 0;
        for s in &self.stops {
            for (k, _) in s.char_indices().skip(1) {
                if k > pending.len() {
                    break;
                }
                if k > best && pending.ends_with(&s[..k]) {
                    best = k;
                }
            }
        }
        best
    }

    /// Ends the stream: the held-back tail (no stop string completed), to emit.
    pub fn finish(&mut self) -> String {
        let out = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        out
    }

    /// All text accepted so far (up to, not including, a stop string that was hit).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether a stop string was hit.
    pub fn stopped(&self) -> bool {
        self.hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let mut s = StopStrings::new(stops.iter().copied());
        let mut out = Vec::new();
        let mut stopped = false;
        for p in pieces {
            let r = s.push(p);
            out.push(r.text);
            if r.stopped {
                stopped = true;
                break;
            }
        }
        if !stopped {
            out.push(s.finish());
        }
        (out, stopped, s.text().to_string())
    }

    #[test]
    fn stop_string_across_pieces_is_never_emitted() {
        let (out, stopped, text) = run(&["</end>"], &["Hello </", "en", "d> more"]);
        assert_eq!(out, ["Hello ", "", ""]);
        assert!(stopped);
        assert_eq!(text, "Hello ");
    }

    #[test]
    fn a_false_start_is_released_once_it_diverges() {
        let (out, stopped, _) = run(&["STOP"], &["a ST", "x", "OP? no"]);
        assert_eq!(out, ["a ", "STx", "OP? no", ""]);
        assert!(!stopped);
    }

    #[test]
    fn held_tail_is_flushed_at_the_end() {
        let (out, stopped, text) = run(&["\n\nUser:"], &["answer\n", "\nUs"]);
        assert_eq!(out, ["answer", "", "\n\nUs"]);
        assert!(!stopped);
        assert_eq!(text, "answer\n\nUs");
    }

    #[test]
    fn earliest_of_several_stops_wins_within_one_piece() {
        let (out, stopped, _) = run(&["bb", "ab"], &["xxabbb"]);
        assert_eq!(out, ["xx"]);
        assert!(stopped);
    }

    #[test]
    fn multibyte_stop_prefixes_hold_whole_characters() {
        let (out, stopped, _) = run(&["日本"], &["今日", "は日", "本"]);
        assert_eq!(out, ["今", "日は", ""]);
        assert!(stopped);
    }

    #[test]
    fn no_stops_passes_everything_through() {
        let (out, stopped, _) = run(&[], &["a", "b"]);
        assert_eq!(out, ["a", "b", ""]);
        assert!(!stopped);
    }
}
