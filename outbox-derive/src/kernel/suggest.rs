//! "Did you mean ...?" for a mistyped key of an attribute.

/// The message for `name` in `#[attr(...)]` when it is none of `keys`,
/// ending in a "did you mean" line when there is a `suggestion`.
pub(crate) fn unknown_key(
    name: &str,
    attr: &str,
    keys: &[&str],
    suggestion: Option<&str>,
) -> String {
    let listed = keys
        .iter()
        .map(|key| format!("`{key}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut message = format!("unknown key `{name}` in `#[{attr}(...)]`; valid keys are {listed}");
    if let Some(suggestion) = suggestion {
        message.push_str(&format!("\nhelp: did you mean `{suggestion}`?"));
    }
    message
}

/// The valid key closest to a mistyped one, if it is close enough to be a typo
/// (or a well-known alias like `aggregate_type`): one is a prefix of the
/// other, or at most two single-character edits apart.
pub(crate) fn closest(name: &str, valid: &[&'static str]) -> Option<&'static str> {
    if let Some(hit) = valid
        .iter()
        .find(|v| name.starts_with(*v) || v.starts_with(name))
    {
        return Some(hit);
    }
    valid
        .iter()
        .map(|v| (edit_distance(name, v), *v))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, v)| v)
}

/// Levenshtein distance: single-character insertions, deletions, substitutions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_keys() {
        let keys = &["topic", "event_type", "aggregate", "crate"];
        assert_eq!(closest("topc", keys), Some("topic"));
        assert_eq!(closest("aggregate_type", keys), Some("aggregate"));
        assert_eq!(closest("eventtype", keys), Some("event_type"));
        assert_eq!(closest("partition", keys), None);
        assert_eq!(
            closest(
                "commandtype",
                &["topic", "command_type", "aggregate", "crate"]
            ),
            Some("command_type")
        );
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("topic", "topic"), 0);
        assert_eq!(edit_distance("topik", "topic"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("crate", "create"), 1);
    }

    #[test]
    fn lists_the_keys_and_the_suggestion() {
        assert_eq!(
            unknown_key("nme", "saga", &["name", "id"], Some("name")),
            "unknown key `nme` in `#[saga(...)]`; valid keys are `name`, `id`\n\
             help: did you mean `name`?"
        );
        assert_eq!(
            unknown_key("x", "event", &["topic"], None),
            "unknown key `x` in `#[event(...)]`; valid keys are `topic`"
        );
    }
}
