//! Case conversion of Rust names: serde's `rename_all` rules for field names
//! (so that `PARTITION_KEY_FIELD` is the name the field has in the JSON
//! payload) and `snake_case` for type names (a saga's default name).

use syn::ext::IdentExt;

/// A `#[serde(rename_all = "...")]` rule.
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

    /// The serialized name of the field `field`, assumed `snake_case` as serde
    /// assumes.
    pub(crate) fn apply_to_field(self, field: &str) -> String {
        match self {
            // serde leaves snake_case field names alone for these two.
            Self::Lower | Self::Snake => field.to_owned(),
            Self::Upper | Self::ScreamingSnake => field.to_ascii_uppercase(),
            Self::Kebab => field.replace('_', "-"),
            Self::ScreamingKebab => field.to_ascii_uppercase().replace('_', "-"),
            Self::Pascal => pascal_case(field),
            Self::Camel => with_first_char(&pascal_case(field), char::to_ascii_lowercase),
        }
    }
}

/// `order_id` → `OrderId`: every `_`-separated word capitalized, underscores
/// dropped.
fn pascal_case(snake: &str) -> String {
    snake
        .split('_')
        .map(|word| with_first_char(word, char::to_ascii_uppercase))
        .collect()
}

/// `word` with `change` applied to its first character.
fn with_first_char(word: &str, change: fn(&char) -> char) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => change(&first).to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// `OrderFulfilment` → `order_fulfilment` (a raw identifier's `r#` dropped).
pub(crate) fn snake_case(ident: &syn::Ident) -> String {
    let name = ident.unraw().to_string();
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_uppercase() {
            out.push(c);
            continue;
        }
        let prev = i.checked_sub(1).map(|p| chars[p]);
        let next = chars.get(i + 1);
        // A word starts at an upper-case letter after a lower-case one or a
        // digit, or at the last capital of an acronym (`HTTPRetry`).
        let boundary = match prev {
            Some(p) if p.is_lowercase() || p.is_ascii_digit() => true,
            Some(p) if p.is_uppercase() => next.is_some_and(|n| n.is_lowercase()),
            _ => false,
        };
        if boundary && !out.ends_with('_') {
            out.push('_');
        }
        out.extend(c.to_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(RenameRule::Pascal.apply_to_field("_a__b_"), "AB");
        assert_eq!(RenameRule::Camel.apply_to_field(""), "");
        assert_eq!(RenameRule::from_name("Title Case"), None);
    }

    #[test]
    fn type_names_become_snake_case() {
        let cases = [
            ("OrderFulfilment", "order_fulfilment"),
            ("Saga", "saga"),
            ("HTTPRetry", "http_retry"),
            ("Order2Ship", "order2_ship"),
            ("r#Order", "order"),
            ("Already_Snake", "already_snake"),
        ];
        for (ident, expected) in cases {
            let ident: syn::Ident = syn::parse_str(ident).unwrap();
            assert_eq!(snake_case(&ident), expected);
        }
    }
}
