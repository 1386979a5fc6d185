//! serde's `rename_all` rules, applied to field names, so that
//! `PARTITION_KEY_FIELD` is the name the field has in the JSON payload.
//!
//! Field names are assumed to be `snake_case`, as serde assumes.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RenameRule {
    Lower,
    Upper,
    Pascal,
    Camel,
    Snake,
    ScreamingSnake,
    Kebab,
    ScreamingKebab,
}

impl RenameRule {
    /// The rule named like in `#[serde(rename_all = "...")]`; `None` for names
    /// serde would reject (serde reports those itself).
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "lowercase" => Self::Lower,
            "UPPERCASE" => Self::Upper,
            "PascalCase" => Self::Pascal,
            "camelCase" => Self::Camel,
            "snake_case" => Self::Snake,
            "SCREAMING_SNAKE_CASE" => Self::ScreamingSnake,
            "kebab-case" => Self::Kebab,
            "SCREAMING-KEBAB-CASE" => Self::ScreamingKebab,
            _ => return None,
        })
    }

    /// The serialized name of the `snake_case` field `field`.
    pub(crate) fn apply_to_field(self, field: &str) -> String {
        match self {
            // serde leaves snake_case field names alone for these two.
            Self::Lower | Self::Snake => field.to_owned(),
            Self::Upper | Self::ScreamingSnake => field.to_ascii_uppercase(),
            Self::Kebab => field.replace('_', "-"),
            Self::ScreamingKebab => field.to_ascii_uppercase().replace('_', "-"),
            Self::Pascal => pascal(field),
            Self::Camel => {
                let pascal = pascal(field);
                let mut chars = pascal.chars();
                match chars.next() {
                    Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
                    None => pascal,
                }
            }
        }
    }
}

/// `order_id` → `OrderId`: every `_`-separated word capitalized, underscores dropped.
fn pascal(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut capitalize = true;
    for c in field.chars() {
        if c == '_' {
            capitalize = true;
        } else if capitalize {
            out.push(c.to_ascii_uppercase());
            capitalize = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::RenameRule;

    #[test]
    fn applies_every_rule_like_serde() {
        let cases = [
            ("lowercase", "order_id"),
            ("UPPERCASE", "ORDER_ID"),
            ("PascalCase", "OrderId"),
            ("camelCase", "orderId"),
            ("snake_case", "order_id"),
            ("SCREAMING_SNAKE_CASE", "ORDER_ID"),
            ("kebab-case", "order-id"),
            ("SCREAMING-KEBAB-CASE", "ORDER-ID"),
        ];
        for (rule, expected) in cases {
            let rule = RenameRule::from_name(rule).unwrap();
            assert_eq!(rule.apply_to_field("order_id"), expected, "{rule:?}");
        }
        assert_eq!(RenameRule::Camel.apply_to_field("id"), "id");
        assert_eq!(RenameRule::Pascal.apply_to_field("a_b_c"), "ABC");
        assert_eq!(RenameRule::from_name("Title Case"), None);
    }
}
