//! Globs over names (`*` any run of characters, dots included; `?` one
//! character), as `[[policy]] queue` and `[security] allow_destinations` use
//! them. Pure.

/// Matches `*` (any run, dots included) and `?` (one character).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names() {
        assert!(glob_match("orders.*", "orders.eu"));
        assert!(glob_match("orders.*", "orders.eu.retry"));
        assert!(!glob_match("orders.*", "orders"));
        assert!(!glob_match("orders.*", "xorders.eu"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("*.dlq.*", "x.dlq.y"));
    }
}
