//! Stop strings over a token stream: a stop string may span several tokens, so text that
//! could be the start of one is held back until it is decided, and the stop text itself is
//! never emitted.

use crate::chat::router::held_tail;

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    /// The stop string that ended the text, once one has.
    matched: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            matched: None,
        }
    }

    /// Add decoded text; returns the text now safe to emit and whether a stop string matched
    /// (generation must end; the text after the match is discarded).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (text.to_string(), false);
        }
        self.pending.push_str(text);
        // The earliest match; at one position the longest stop string (it contains the others).
        let first = self
            .stops
            .iter()
            .filter_map(|s| {
                self.pending
                    .find(s.as_str())
                    .map(|i| (i, std::cmp::Reverse(s.len()), s))
            })
            .min();
        if let Some((i, _, stop)) = first {
            let out = self.pending[..i].to_string();
            self.matched = Some(stop.clone());
            self.pending.clear();
            return (out, true);
        }
        let stops: Vec<&str> = self.stops.iter().map(String::as_str).collect();
        let keep = held_tail(&self.pending, &stops);
        let out = self.pending[..keep].to_string();
        self.pending.drain(..keep);
        (out, false)
    }

    /// The stop string that matched (Anthropic's `stop_sequence`).
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Generation ended without a match: the held text is ordinary output after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, hit) = m.push(p);
            out.push_str(&t);
            if hit {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_across_token_boundaries_is_not_emitted() {
        assert_eq!(run(&["END"], &["abc E", "N", "D tail"]), ("abc ".into(), true));
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn false_starts_are_released() {
        assert_eq!(run(&["END"], &["E", "N", "x"]), ("ENx".into(), false));
        assert_eq!(run(&["END"], &["abc EN"]), ("abc EN".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["world", "lo"], &["hello world"]), ("hel".into(), true));
    }

    #[test]
    fn text_held_for_a_stop_prefix_waits() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("abE"), ("ab".into(), false));
        assert_eq!(m.push("N"), (String::new(), false));
        assert_eq!(m.push("!"), ("EN!".into(), false));
    }
}
