//! [`SchemaExport`]: the generated files, written to or checked against a directory.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::io;
use std::path::Path;

use super::EventDescriptor;
use super::asyncapi::{self, DocumentEvent};
use super::check::{Difference, DifferenceKind, Differences, incompatibilities};
use super::json::{canonical_json, event_schema};
use super::problem::ExportProblem;

/// Name of the AsyncAPI document inside the export directory.
pub(super) const ASYNCAPI_FILE: &str = "asyncapi.yaml";

/// Settings of an export. Build with [`ExportOptions::new`] and the setters.
///
/// ```
/// use txoutbox_core::schema::ExportOptions;
///
/// let options = ExportOptions::new()
///     .title("orders")
///     .version("2.1.0")
///     .description("Events of the orders service.")
///     .id_base("https://schemas.example.com/orders/");
/// let export = options.export(&[]).unwrap();
/// assert!(export.file("asyncapi.yaml").unwrap().contains("title: orders"));
/// ```
#[derive(Debug, Clone)]
pub struct ExportOptions {
    title: String,
    version: String,
    description: Option<String>,
    id_base: String,
    cloudevents: bool,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl ExportOptions {
    /// Defaults: title `"Domain events"`, version `"0.1.0"`, no description,
    /// empty id base (each schema's `$id` is its relative path,
    /// `<topic>/<event_type>.json`).
    pub fn new() -> Self {
        Self {
            title: "Domain events".to_owned(),
            version: "0.1.0".to_owned(),
            description: None,
            id_base: String::new(),
            cloudevents: false,
        }
    }

    /// `info.title` of the AsyncAPI document, usually the service name.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = title.into();
        self
    }

    /// `info.version` of the AsyncAPI document, usually the crate version.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// `info.description` of the AsyncAPI document.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Prefix of each schema's `$id` (e.g. the URL the `schemas/` directory is
    /// published at, ending in `/`); the relative path is appended.
    pub fn id_base(mut self, id_base: impl Into<String>) -> Self {
        self.id_base = id_base.into();
        self
    }

    /// Describes the `ce_` headers of CloudEvents' binary content mode in
    /// every message of the AsyncAPI document: set it when the relay
    /// publishes with `RelayBuilder::cloudevents` (the ones it always sends
    /// as required, the others as optional). Default `false`.
    pub fn cloudevents(mut self, on: bool) -> Self {
        self.cloudevents = on;
        self
    }

    /// Generates the files for `events`.
    ///
    /// Fails, listing every problem, when two events share a topic and event
    /// type, a topic or event type is not a safe file name, or an event's
    /// schema is unusable (not an object, not draft 2020-12, or without the
    /// partition key field among its properties).
    pub fn export(&self, events: &[&EventDescriptor]) -> Result<SchemaExport, ExportError> {
        let mut problems = Vec::new();
        let mut events: Vec<&EventDescriptor> = events.to_vec();
        events.sort_by_key(|e| (e.topic, e.event_type));

        let mut seen = BTreeMap::<(&str, &str), &EventDescriptor>::new();
        let mut schemas = Vec::new();
        for event in events {
            if let Some(first) = seen.insert((event.topic, event.event_type), event) {
                problems.push(ExportProblem::Duplicate {
                    topic: event.topic,
                    event_type: event.event_type,
                    first: first.rust_type,
                    second: event.rust_type,
                });
                continue;
            }
            let mut names_ok = true;
            for (what, name) in [("topic", event.topic), ("event type", event.event_type)] {
                if !is_safe_name(name) {
                    names_ok = false;
                    problems.push(ExportProblem::UnsafeName {
                        rust_type: event.rust_type,
                        what,
                        name: name.to_owned(),
                    });
                }
            }
            if !names_ok {
                continue;
            }
            let id = format!("{}{}", self.id_base, schema_path(event));
            match event_schema(event, &id) {
                Ok(schema) => schemas.push((event, schema)),
                Err(problem) => problems.push(problem),
            }
        }
        if !problems.is_empty() {
            return Err(ExportError { problems });
        }

        let mut files = BTreeMap::new();
        for (event, schema) in &schemas {
            files.insert(schema_path(event), canonical_json(schema));
        }
        let document_events: Vec<_> = schemas
            .iter()
            .map(|(descriptor, schema)| DocumentEvent { descriptor, schema })
            .collect();
        let yaml = asyncapi::render(
            &self.title,
            &self.version,
            self.description.as_deref(),
            &document_events,
            self.cloudevents,
        )
        .map_err(|e| ExportError {
            problems: vec![ExportProblem::Yaml(e)],
        })?;
        files.insert(ASYNCAPI_FILE.to_owned(), yaml);
        Ok(SchemaExport { files })
    }
}

/// Topic and event type become a directory and a file name, and AsyncAPI
/// component keys (`^[a-zA-Z0-9.\-_]+$`), so only those characters are allowed.
fn is_safe_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn schema_path(event: &EventDescriptor) -> String {
    format!("{}/{}.json", event.topic, event.event_type)
}

/// The generated schema files, by path relative to the export directory
/// (`/`-separated): `<topic>/<event_type>.json` per event and `asyncapi.yaml`.
///
/// The export owns `asyncapi.yaml` and the `*.json` files one directory deep;
/// [`write_to`](Self::write_to) and [`check`](Self::check) leave any other
/// file (a README, say) alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaExport {
    files: BTreeMap<String, String>,
}

impl SchemaExport {
    /// Exports every event registered in this binary (see
    /// [`registered_events`](super::registered_events)) with default
    /// [`ExportOptions`].
    pub fn from_registry() -> Result<Self, ExportError> {
        ExportOptions::new().export(&super::registered_events())
    }

    /// Exports the given events with default [`ExportOptions`].
    pub fn from_descriptors(events: &[&EventDescriptor]) -> Result<Self, ExportError> {
        ExportOptions::new().export(events)
    }

    /// The generated files: relative path and contents, sorted by path.
    pub fn files(&self) -> impl Iterator<Item = (&str, &str)> {
        self.files.iter().map(|(p, c)| (p.as_str(), c.as_str()))
    }

    /// The contents of one generated file, by relative path.
    pub fn file(&self, path: &str) -> Option<&str> {
        self.files.get(path).map(String::as_str)
    }

    /// Writes the files under `dir` (created if needed), rewriting only files
    /// whose contents differ and deleting owned files the code no longer
    /// generates (and topic directories left empty).
    pub fn write_to(&self, dir: impl AsRef<Path>) -> io::Result<WriteReport> {
        let dir = dir.as_ref();
        let mut report = WriteReport::default();
        for (path, contents) in &self.files {
            let target = dir.join(path);
            if fs::read(&target).ok().as_deref() == Some(contents.as_bytes()) {
                report.unchanged += 1;
                continue;
            }
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::write(&target, contents)?;
            report.written.push(path.clone());
        }
        for path in owned_files(dir)? {
            if self.files.contains_key(&path) {
                continue;
            }
            let target = dir.join(&path);
            fs::remove_file(&target)?;
            if let Some(parent) = target.parent().filter(|p| *p != dir)
                && fs::read_dir(parent)?.next().is_none()
            {
                fs::remove_dir(parent)?;
            }
            report.removed.push(path);
        }
        Ok(report)
    }

    /// Compares the files under `dir` with the generated ones.
    ///
    /// Returns every missing, extra and changed file; changed event schemas
    /// also list the changes that break consumers (see
    /// [`DifferenceKind::Changed`]).
    pub fn check(&self, dir: impl AsRef<Path>) -> Result<(), Differences> {
        let dir = dir.as_ref();
        let mut entries = Vec::new();
        let on_disk = match owned_files(dir) {
            Ok(files) => files,
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeSet::new(),
            Err(e) => {
                entries.push(Difference {
                    path: String::new(),
                    kind: DifferenceKind::Unreadable(e.to_string()),
                });
                BTreeSet::new()
            }
        };
        let all: BTreeSet<&String> = self.files.keys().chain(on_disk.iter()).collect();
        for path in all {
            let kind = match (self.files.get(path), on_disk.contains(path)) {
                (Some(_), false) => DifferenceKind::Missing,
                (None, _) => DifferenceKind::Extra,
                (Some(expected), true) => match fs::read_to_string(dir.join(path)) {
                    Ok(found) if &found == expected => continue,
                    Ok(found) => DifferenceKind::Changed {
                        incompatible: if path.ends_with(".json") {
                            incompatibilities(&found, expected)
                        } else {
                            Vec::new()
                        },
                    },
                    Err(e) => DifferenceKind::Unreadable(e.to_string()),
                },
            };
            entries.push(Difference {
                path: path.clone(),
                kind,
            });
        }
        if entries.is_empty() {
            Ok(())
        } else {
            Err(Differences {
                dir: dir.to_path_buf(),
                entries,
            })
        }
    }
}

/// The owned files present under `dir`: `asyncapi.yaml` and `*/*.json`.
fn owned_files(dir: &Path) -> io::Result<BTreeSet<String>> {
    let mut files = BTreeSet::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let file_type = entry.file_type()?;
        if file_type.is_file() && name == ASYNCAPI_FILE {
            files.insert(name);
        } else if file_type.is_dir() {
            for inner in fs::read_dir(entry.path())? {
                let inner = inner?;
                let inner_name = inner.file_name().to_string_lossy().into_owned();
                if inner.file_type()?.is_file() && inner_name.ends_with(".json") {
                    files.insert(format!("{name}/{inner_name}"));
                }
            }
        }
    }
    Ok(files)
}

/// What [`SchemaExport::write_to`] did, paths relative to the directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteReport {
    /// Files created or rewritten.
    pub written: Vec<String>,
    /// Owned files deleted because the code no longer generates them.
    pub removed: Vec<String>,
    /// Files already up to date.
    pub unchanged: usize,
}

/// Why an export could not be generated: every problem found, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportError {
    problems: Vec<ExportProblem>,
}

impl ExportError {
    /// The problems, one message each.
    pub fn problems(&self) -> Vec<String> {
        self.problems.iter().map(ToString::to_string).collect()
    }
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "schema export failed:")?;
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ExportError {}
