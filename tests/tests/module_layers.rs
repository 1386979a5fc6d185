//! Every crate's modules form a DAG: no module depends, directly or through
//! its siblings, on a sibling that depends back on it (issue 23, "modules
//! that only point down").
//!
//! The test reads each crate's sources with `syn`, resolves every path that
//! starts with `crate`, `super` or `self` (in `use` items, in code and inside
//! macro invocations) to the module that defines its item, following the
//! `use` declarations a path goes through (`super::Consumer` in a child of
//! `consumer/` that `consumer/mod.rs` re-exports from `builder` is a use of
//! `builder`), and records an edge between the two sibling modules that
//! contain the user and the item. A strongly connected set of siblings is a
//! cycle; the failure names each edge and the module whose code makes it.
//! Doc comments and intra-doc links are not dependencies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// The crates whose sources are checked (library and binary code alike).
const CRATES: &[&str] = &[
    "outbox-core",
    "outbox-runtime",
    "outbox-derive",
    "outbox-cli",
    "outbox-testkit",
    "examples",
    "tests",
];

type ModPath = Vec<String>;

/// What one crate's sources define: its modules, and per module the names
/// its `use` declarations bind (name -> absolute path, unresolved).
#[derive(Default)]
struct Crate {
    modules: BTreeSet<ModPath>,
    aliases: BTreeMap<ModPath, BTreeMap<String, Vec<String>>>,
    /// Every path a module's code names: (user module, path as written).
    uses: Vec<(ModPath, Vec<String>)>,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// The module path of a source file under `src/`: `consumer/inbox/mod.rs`
/// is `consumer::inbox`, `lib.rs`, `main.rs` and `bin/*.rs` are roots.
fn file_module(src: &Path, file: &Path) -> Option<ModPath> {
    let relative = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.first().map(String::as_str) == Some("bin") {
        // A binary is a crate of its own; its modules are checked as one.
        return None;
    }
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    Some(parts)
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// Collects modules, aliases and paths of one file, tracking inline modules.
struct FileVisitor<'a> {
    krate: &'a mut Crate,
    module: ModPath,
}

impl FileVisitor<'_> {
    fn record(&mut self, segments: &[String]) {
        if !segments.is_empty() {
            self.krate
                .uses
                .push((self.module.clone(), segments.to_vec()));
        }
    }

    /// Walks a `use` tree: each leaf is a path the module names, each
    /// binding (name or rename) an alias of the module.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let leaf = name.ident.to_string();
                let bound = if leaf == "self" {
                    prefix.last().cloned()
                } else {
                    Some(leaf.clone())
                };
                let mut full = prefix.clone();
                if leaf != "self" {
                    full.push(leaf);
                }
                self.bind(bound, &full);
            }
            syn::UseTree::Rename(rename) => {
                let mut full = prefix.clone();
                if rename.ident != "self" {
                    full.push(rename.ident.to_string());
                }
                self.bind(Some(rename.rename.to_string()), &full);
            }
            syn::UseTree::Glob(_) => self.record(prefix),
            syn::UseTree::Group(group) => {
                for item in &group.items {
                    self.use_tree(prefix, item);
                }
            }
        }
    }

    fn bind(&mut self, name: Option<String>, full: &[String]) {
        self.record(full);
        if let Some(name) = name {
            self.krate
                .aliases
                .entry(self.module.clone())
                .or_default()
                .insert(name, full.to_vec());
        }
    }

    /// Paths inside a macro invocation's tokens: `crate :: a :: b`,
    /// `super :: x`, `self :: y`.
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut index = 0;
        while index < tokens.len() {
            match &tokens[index] {
                TokenTree::Group(group) => {
                    self.tokens(group.stream());
                    index += 1;
                }
                TokenTree::Ident(ident)
                    if matches!(ident.to_string().as_str(), "crate" | "super" | "self") =>
                {
                    let mut segments = vec![ident.to_string()];
                    index += 1;
                    while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) =
                        (tokens.get(index), tokens.get(index + 1))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        match tokens.get(index + 2) {
                            Some(TokenTree::Ident(next)) => {
                                segments.push(next.to_string());
                                index += 3;
                            }
                            _ => break,
                        }
                    }
                    if segments.len() > 1 {
                        self.record(&segments);
                    }
                }
                _ => index += 1,
            }
        }
    }
}

impl<'ast> Visit<'ast> for FileVisitor<'_> {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        let mut module = self.module.clone();
        module.push(item.ident.to_string());
        self.krate.modules.insert(module.clone());
        if item.content.is_some() {
            let outer = std::mem::replace(&mut self.module, module);
            syn::visit::visit_item_mod(self, item);
            self.module = outer;
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path
            .segments
            .iter()
            .map(|segment| segment.ident.to_string())
            .collect();
        self.record(&segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {
        // Doc comments and other attributes name no dependency.
    }
}

fn read_crate(dir: &Path) -> Crate {
    let src = dir.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut krate = Crate::default();
    krate.modules.insert(Vec::new());
    for file in files {
        let Some(module) = file_module(&src, &file) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let parsed = syn::parse_file(&text)
            .unwrap_or_else(|error| panic!("{} does not parse: {error}", file.display()));
        krate.modules.insert(module.clone());
        let mut visitor = FileVisitor {
            krate: &mut krate,
            module,
        };
        visitor.visit_file(&parsed);
    }
    krate
}

impl Crate {
    /// Makes a path written in `module` absolute within the crate, or `None`
    /// for a path that leaves it (another crate, a local name). A path may
    /// start with `crate`, `self`, `super` or (2018 paths) a child module.
    fn absolute(&self, module: &[String], segments: &[String]) -> Option<ModPath> {
        let first = segments.first()?;
        match first.as_str() {
            "crate" => Some(segments[1..].to_vec()),
            "self" | "super" => {
                let mut base = module.to_vec();
                let mut rest = segments;
                if rest.first().map(String::as_str) == Some("self") {
                    rest = &rest[1..];
                }
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                Some(base)
            }
            child => {
                let mut base = module.to_vec();
                base.push(child.to_owned());
                self.modules.contains(&base).then(|| {
                    base.extend(segments[1..].iter().cloned());
                    base
                })
            }
        }
    }

    /// The module that defines what `path` names, following `use`
    /// declarations (a re-export is a use of the module it re-exports).
    fn owner(&self, path: &[String], depth: usize) -> ModPath {
        let mut module: ModPath = Vec::new();
        for (index, segment) in path.iter().enumerate() {
            let mut child = module.clone();
            child.push(segment.clone());
            if self.modules.contains(&child) {
                module = child;
                continue;
            }
            if depth < 16
                && let Some(written) = self.aliases.get(&module).and_then(|a| a.get(segment))
                && let Some(target) = self.absolute(&module, written)
                && target.as_slice() != &path[..=index]
            {
                let mut through = target.clone();
                through.extend(path[index + 1..].iter().cloned());
                return self.owner(&through, depth + 1);
            }
            break;
        }
        module
    }

    /// Edges between siblings: (parent, from child, to child) -> the modules
    /// whose code makes the edge.
    fn sibling_edges(&self) -> BTreeMap<(ModPath, String, String), BTreeSet<String>> {
        let mut edges: BTreeMap<_, BTreeSet<String>> = BTreeMap::new();
        for (user, written) in &self.uses {
            let Some(path) = self.absolute(user, written) else {
                continue;
            };
            let owner = self.owner(&path, 0);
            let common = user.iter().zip(&owner).take_while(|(a, b)| a == b).count();
            if common < user.len() && common < owner.len() {
                let parent = user[..common].to_vec();
                edges
                    .entry((parent, user[common].clone(), owner[common].clone()))
                    .or_default()
                    .insert(user.join("::"));
            }
        }
        edges
    }
}

/// Strongly connected sets of more than one sibling (Tarjan's algorithm).
fn cycles(nodes: &BTreeSet<String>, edges: &BTreeSet<(String, String)>) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        edges: &'a BTreeSet<(String, String)>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        found: Vec<BTreeSet<String>>,
    }
    fn connect(state: &mut State<'_>, node: &str) {
        let at = state.index.len();
        state.index.insert(node.to_owned(), at);
        state.low.insert(node.to_owned(), at);
        state.stack.push(node.to_owned());
        let next: Vec<String> = state
            .edges
            .iter()
            .filter(|(from, _)| from == node)
            .map(|(_, to)| to.clone())
            .collect();
        for to in next {
            if !state.index.contains_key(&to) {
                connect(state, &to);
                let low = state.low[&to].min(state.low[node]);
                state.low.insert(node.to_owned(), low);
            } else if state.stack.contains(&to) {
                let low = state.index[&to].min(state.low[node]);
                state.low.insert(node.to_owned(), low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = BTreeSet::new();
            while let Some(member) = state.stack.pop() {
                let done = member == node;
                component.insert(member);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for node in nodes {
        if !state.index.contains_key(node) {
            connect(&mut state, node);
        }
    }
    state.found
}

/// Every import cycle of one crate, described for a failure message.
fn import_cycles(krate: &Crate, name: &str) -> Vec<String> {
    let edges = krate.sibling_edges();
    let parents: BTreeSet<&ModPath> = edges.keys().map(|(parent, _, _)| parent).collect();
    let mut problems = Vec::new();
    for parent in parents {
        let local: BTreeSet<(String, String)> = edges
            .keys()
            .filter(|(p, _, _)| p == parent)
            .map(|(_, from, to)| (from.clone(), to.clone()))
            .collect();
        let nodes: BTreeSet<String> = local
            .iter()
            .flat_map(|(a, b)| [a.clone(), b.clone()])
            .collect();
        for component in cycles(&nodes, &local) {
            let prefix = if parent.is_empty() {
                String::new()
            } else {
                format!("{}::", parent.join("::"))
            };
            let mut text = format!(
                "{name}: cycle between {}",
                component
                    .iter()
                    .map(|m| format!("{prefix}{m}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for ((p, from, to), users) in &edges {
                if p == parent && component.contains(from) && component.contains(to) {
                    text.push_str(&format!(
                        "\n    {prefix}{from} -> {prefix}{to} (in {})",
                        users.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
            problems.push(text);
        }
    }
    problems
}

#[test]
fn no_crate_has_an_import_cycle_between_sibling_modules() {
    let root = workspace_root();
    let mut problems = Vec::new();
    for name in CRATES {
        let krate = read_crate(&root.join(name));
        assert!(
            krate.modules.len() > 1 || *name == "outbox-testkit",
            "{name}: no modules read"
        );
        problems.extend(import_cycles(&krate, name));
    }
    assert!(
        problems.is_empty(),
        "modules must only point down (docs/architecture.md, \"Layers\"):\n{}",
        problems.join("\n")
    );
}

/// The checker itself: a cycle through a re-export, through a macro's
/// tokens and through `super::` is found; a child using its parent is not
/// a cycle.
#[test]
fn the_checker_finds_cycles_through_re_exports_macros_and_super() {
    let source = |text: &str| syn::parse_file(text).expect("test source parses");
    let mut krate = Crate::default();
    krate.modules.insert(Vec::new());
    for (module, text) in [
        (vec![], "mod a; mod b; mod c; pub use a::Thing;"),
        (vec!["a"], "pub struct Thing; fn f() { crate::b::g(); }"),
        (vec!["b"], "pub fn g() { let _ = super::Thing; }"),
        (
            vec!["c"],
            "fn h() { tokio::select! { _ = async {} => crate::b::g() } }",
        ),
    ] {
        let module: ModPath = module.into_iter().map(str::to_owned).collect();
        krate.modules.insert(module.clone());
        let parsed = source(text);
        FileVisitor {
            krate: &mut krate,
            module,
        }
        .visit_file(&parsed);
    }
    let problems = import_cycles(&krate, "sample");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("cycle between a, b"),
        "{}",
        problems[0]
    );
    assert!(problems[0].contains("b -> a (in b)"), "{}", problems[0]);
    let edges = krate.sibling_edges();
    assert!(
        edges.contains_key(&(Vec::new(), "c".to_owned(), "b".to_owned())),
        "a path inside a macro's tokens is an edge: {edges:?}"
    );
}
