//! The result of [`SchemaExport::check`](super::SchemaExport::check), and the
//! classification of schema changes that break consumers.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::json::{X_AGGREGATE_TYPE, X_KIND, X_PARTITION_KEY};

/// Every way a directory differs from what the code generates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Differences {
    /// The directory that was checked.
    pub dir: PathBuf,
    /// One entry per differing file, sorted by path.
    pub entries: Vec<Difference>,
}

/// One differing file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// Path relative to the checked directory, `/`-separated (empty when the
    /// directory itself could not be read).
    pub path: String,
    /// How it differs.
    pub kind: DifferenceKind,
}

/// How a file differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DifferenceKind {
    /// The code generates the file; the directory lacks it.
    Missing,
    /// The directory has the file; the code no longer generates it (an event
    /// type was removed or renamed: consumers of it stop receiving events).
    Extra,
    /// Both have the file with different contents.
    Changed {
        /// For event schemas: each change that breaks consumers or replay of
        /// stored events (a property removed or retyped, a property newly
        /// required or no longer required, a new partition key or aggregate
        /// type). Empty for compatible changes such as a new optional field.
        incompatible: Vec<String>,
    },
    /// The file or directory could not be read.
    Unreadable(String),
}

impl std::error::Error for Differences {}

impl fmt::Display for Differences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = self.dir.display();
        write!(
            f,
            "{dir} differs from the schemas the code generates ({} file{}):",
            self.entries.len(),
            if self.entries.len() == 1 { "" } else { "s" }
        )?;
        for entry in &self.entries {
            let path = self.dir.join(&entry.path);
            let path = path.display();
            match &entry.kind {
                DifferenceKind::Missing => write!(f, "\n  missing  {path}")?,
                DifferenceKind::Extra => write!(f, "\n  extra    {path}")?,
                DifferenceKind::Changed { incompatible } if incompatible.is_empty() => {
                    write!(f, "\n  changed  {path}")?
                }
                DifferenceKind::Changed { incompatible } => write!(
                    f,
                    "\n  changed  {path} (incompatible: {})",
                    incompatible.join("; ")
                )?,
                DifferenceKind::Unreadable(e) => write!(f, "\n  unreadable {path}: {e}")?,
            }
        }
        Ok(())
    }
}

/// Lists the consumer-breaking differences between the committed schema
/// `old` and the generated schema `new` (both JSON text): partition key and
/// aggregate type, then the properties of the event, of nested objects, of
/// array items and of the types under `$defs` (compared by name).
pub(super) fn incompatibilities(old: &str, new: &str) -> Vec<String> {
    let (Ok(old), Ok(new)) = (
        serde_json::from_str::<Value>(old),
        serde_json::from_str::<Value>(new),
    ) else {
        return vec!["the committed file is not valid JSON".to_owned()];
    };
    let mut notes = Vec::new();
    for (keyword, what) in [
        (X_PARTITION_KEY, "partition key field"),
        (X_AGGREGATE_TYPE, "aggregate type"),
        (X_KIND, "message kind"),
    ] {
        if old.get(keyword) != new.get(keyword) {
            notes.push(format!(
                "{what} changed from {} to {}",
                shown(old.get(keyword)),
                shown(new.get(keyword))
            ));
        }
    }
    compare_object("", &old, &new, &mut notes);

    let empty = Map::new();
    let defs = |schema: &Value| schema.get("$defs").and_then(Value::as_object).cloned();
    let (old_defs, new_defs) = (defs(&old), defs(&new));
    let new_defs = new_defs.as_ref().unwrap_or(&empty);
    for (name, old_def) in old_defs.as_ref().unwrap_or(&empty) {
        // A removed type shows up as a changed `$ref` where it was used.
        let Some(new_def) = new_defs.get(name) else {
            continue;
        };
        if shape(old_def) != shape(new_def) {
            notes.push(format!(
                "type `{name}` changed from {} to {}",
                shape(old_def),
                shape(new_def)
            ));
        }
        compare_object(&format!("{name}."), old_def, new_def, &mut notes);
    }
    notes
}

/// Compares the properties of two object schemas; `prefix` names where they
/// are (`""` for the event, `"address."` for a nested object).
fn compare_object(prefix: &str, old: &Value, new: &Value, notes: &mut Vec<String>) {
    let empty = Map::new();
    let old_props = properties(old).unwrap_or(&empty);
    let new_props = properties(new).unwrap_or(&empty);
    let old_required = required(old);
    let new_required = required(new);
    for (name, old_schema) in old_props {
        let path = format!("{prefix}{name}");
        let Some(new_schema) = new_props.get(name) else {
            notes.push(format!("property `{path}` removed"));
            continue;
        };
        if shape(old_schema) != shape(new_schema) {
            notes.push(format!(
                "property `{path}` changed type from {} to {}",
                shape(old_schema),
                shape(new_schema)
            ));
            continue;
        }
        compare_object(&format!("{path}."), old_schema, new_schema, notes);
        if let (Some(old_items), Some(new_items)) =
            (old_schema.get("items"), new_schema.get("items"))
        {
            if shape(old_items) != shape(new_items) {
                notes.push(format!(
                    "items of `{path}` changed type from {} to {}",
                    shape(old_items),
                    shape(new_items)
                ));
            } else {
                compare_object(&format!("{path}[]."), old_items, new_items, notes);
            }
        }
    }
    for name in new_required.difference(&old_required) {
        if old_props.contains_key(*name) {
            notes.push(format!("property `{prefix}{name}` is now required"));
        } else {
            notes.push(format!(
                "new required property `{prefix}{name}` (stored events lack it; add it as optional)"
            ));
        }
    }
    for name in old_required.difference(&new_required) {
        if new_props.contains_key(*name) {
            notes.push(format!("property `{prefix}{name}` is no longer required"));
        }
    }
}

fn properties(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties")?.as_object()
}

fn required(schema: &Value) -> BTreeSet<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A short description of a schema's shape: the keywords that decide which
/// JSON values it accepts at its own level, plus the values of an enum that
/// schemars wrote as `oneOf` / `anyOf` of `const`s (documented variants).
fn shape(schema: &Value) -> String {
    let mut parts: Vec<String> = ["type", "format", "$ref", "enum", "const"]
        .into_iter()
        .filter_map(|k| schema.get(k).map(|v| format!("{k}={v}")))
        .collect();
    for keyword in ["oneOf", "anyOf"] {
        let Some(variants) = schema.get(keyword).and_then(Value::as_array) else {
            continue;
        };
        let consts: Vec<String> = variants
            .iter()
            .filter_map(|v| v.get("const").or_else(|| v.get("enum")))
            .map(Value::to_string)
            .collect();
        if !consts.is_empty() {
            parts.push(format!("{keyword}=[{}]", consts.join(",")));
        }
    }
    if parts.is_empty() {
        "any".to_owned()
    } else {
        parts.join(",")
    }
}

fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "none".to_owned(), Value::to_string)
}
