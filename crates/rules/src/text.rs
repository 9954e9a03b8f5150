//! What of an object's names may appear in rule text. nft chain and set names are identifiers
//! (nft 1.0.6 takes no quoted ones); comments, in nft scripts and in iptables-restore input, are
//! quoted strings in which a quote, a backslash or a newline would end the string or the rule.
//! Whatever a Service, port or namespace is called, `roadkeeper rules` prints a script `nft -f`
//! accepts (and netlink carries the very same text), and no name can add an iptables rule.
//! Validation already refuses such names; this holds without it.

use std::borrow::Cow;

/// Longest chain or set name the kernel takes (`NFT_NAME_MAXLEN` less its NUL).
pub const NAME_MAX: usize = 255;
/// Longest comment nft takes (`NFTNL_UDATA_COMMENT_MAXLEN`).
pub const COMMENT_MAX: usize = 128;

/// `readable` made fit for the tail of an identifier after `prefix`: characters outside
/// `[A-Za-z0-9/_.-]` become `_`, and it is cut so that the whole name fits [`NAME_MAX`]. The
/// prefix (kind and hash) keeps names unique.
pub fn identifier(prefix: &str, readable: &str) -> String {
    let room = NAME_MAX.saturating_sub(prefix.len());
    let tail = readable
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '.' | '-') { c } else { '_' })
        .take(room);
    let mut name = String::with_capacity(prefix.len() + room);
    name.push_str(prefix);
    name.extend(tail);
    name
}

/// `text` made fit for a quoted nft comment ([`quotable`] within [`COMMENT_MAX`] bytes).
pub fn comment(text: &str) -> Cow<'_, str> {
    quotable(text, COMMENT_MAX)
}

/// `text` made fit for a quoted string without escapes: `"`, `\`, control characters and
/// non-ASCII (limits count bytes) become `_`, and it is cut to `max` bytes.
pub fn quotable(text: &str, max: usize) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii() && !c.is_ascii_control() && !matches!(c, '"' | '\\');
    if text.len() <= max && text.chars().all(plain) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(text.chars().map(|c| if plain(c) { c } else { '_' }).take(max).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_and_comments_are_kept() {
        assert_eq!(identifier("service-ABCDEFGH-", "ns/web/tcp/http"), "service-ABCDEFGH-ns/web/tcp/http");
        assert!(matches!(comment("ns/web:http"), Cow::Borrowed("ns/web:http")));
    }

    #[test]
    fn hostile_names_and_comments_cannot_leave_their_place() {
        let hostile = "x\" ; flush ruleset ; add rule ip t c accept comment \"\n}\\é";
        let name = identifier("service-H-", hostile);
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || "/_.-".contains(c)), "{name}");
        let text = comment(hostile);
        assert!(!text.contains(['"', '\n', '\\']) && text.is_ascii(), "{text}");
        assert_eq!(identifier("p-", &"a".repeat(400)).len(), NAME_MAX);
        assert_eq!(comment(&"a".repeat(400)).len(), COMMENT_MAX);
    }
}
