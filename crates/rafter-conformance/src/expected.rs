//! The committed list of expected failures: it may only shrink.

use std::collections::BTreeMap;

/// `test_name  # one-line reason` per line; blank lines and `#` comments are ignored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpectedFailures {
    pub entries: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected-failure list line {line}: {msg}")]
pub struct ExpectedParseError {
    pub line: usize,
    pub msg: String,
}

impl ExpectedFailures {
    pub fn parse(text: &str) -> Result<ExpectedFailures, ExpectedParseError> {
        let mut entries = BTreeMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, reason) = line.split_once('#').ok_or_else(|| ExpectedParseError {
                line: i + 1,
                msg: format!("`{line}` has no `# reason`"),
            })?;
            let (name, reason) = (name.trim(), reason.trim());
            if name.is_empty() || name.contains(char::is_whitespace) || reason.is_empty() {
                return Err(ExpectedParseError {
                    line: i + 1,
                    msg: format!("want `test_name  # reason`, got `{line}`"),
                });
            }
            if entries
                .insert(name.to_string(), reason.to_string())
                .is_some()
            {
                return Err(ExpectedParseError {
                    line: i + 1,
                    msg: format!("`{name}` is listed twice"),
                });
            }
        }
        Ok(ExpectedFailures { entries })
    }

    /// The file form, sorted by test name.
    pub fn render(&self, header: &str) -> String {
        let mut out = String::from(header);
        for (name, reason) in &self.entries {
            out.push_str(&format!("{name}  # {}\n", reason.replace('\n', " ")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let e =
            ExpectedFailures::parse("# header\n\ntest_a  # unsupported op `Foo`\ntest_b # x # y\n")
                .unwrap();
        assert_eq!(e.entries["test_a"], "unsupported op `Foo`");
        assert_eq!(e.entries["test_b"], "x # y");
        assert_eq!(ExpectedFailures::parse("test_a\n").unwrap_err().line, 1);
        assert!(ExpectedFailures::parse("a # x\na # y\n")
            .unwrap_err()
            .msg
            .contains("twice"));
        let again = ExpectedFailures::parse(&e.render("# h\n")).unwrap();
        assert_eq!(again, e);
    }
}
