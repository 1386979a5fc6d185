//! The workspace's `rust-version` is the real minimum: the highest
//! `rust-version` any dependency of a publishable crate declares.
//!
//! Only one toolchain is installed here, so the minimum cannot be found by
//! building with older compilers; it is derived from the dependencies' own
//! declared minimums instead (README, "Workspace"). This test recomputes it
//! from `cargo metadata` and fails when a dependency update raises it (or when
//! the declared value is higher than anything requires).

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use serde_json::Value;

fn parse_version(text: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = text
        .split('.')
        .map(|part| part.parse().expect("numeric rust-version"))
        .collect();
    parts.resize(3, 0);
    parts
}

#[test]
fn declared_rust_version_is_the_highest_minimum_of_the_dependencies() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata JSON");

    let packages: HashMap<&str, &Value> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|package| (package["id"].as_str().expect("id"), package))
        .collect();
    let members: BTreeSet<&str> = metadata["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .map(|id| id.as_str().expect("member id"))
        .collect();
    let nodes: HashMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .expect("resolve nodes")
        .iter()
        .map(|node| (node["id"].as_str().expect("node id"), node))
        .collect();

    // `publish = false` shows up as an empty registry list.
    let publishable = |id: &str| {
        packages[id]["publish"]
            .as_array()
            .is_none_or(|registries| !registries.is_empty())
    };
    let roots: Vec<&str> = members
        .iter()
        .copied()
        .filter(|id| publishable(id))
        .collect();
    assert!(
        roots.len() >= 4,
        "expected the four publishable crates, found {roots:?}"
    );

    // Everything a user's build compiles: normal and build dependencies,
    // transitively (dev-dependencies are the workspace's own business).
    let mut reachable = BTreeSet::new();
    let mut stack = roots.clone();
    while let Some(id) = stack.pop() {
        if !reachable.insert(id) {
            continue;
        }
        for dependency in nodes[id]["deps"].as_array().expect("deps") {
            let used_by_users = dependency["dep_kinds"]
                .as_array()
                .expect("dep_kinds")
                .iter()
                .any(|kind| kind["kind"].is_null() || kind["kind"] == "build");
            if used_by_users {
                stack.push(dependency["pkg"].as_str().expect("pkg"));
            }
        }
    }

    let (required, by) = reachable
        .iter()
        .filter(|id| !members.contains(*id))
        .filter_map(|id| {
            let package = packages[id];
            let version = package["rust_version"].as_str()?;
            Some((
                parse_version(version),
                package["name"].as_str().unwrap_or("?"),
            ))
        })
        .max()
        .expect("some dependency declares a rust-version");

    for root in &roots {
        let package = packages[root];
        let declared = parse_version(
            package["rust_version"]
                .as_str()
                .unwrap_or_else(|| panic!("{} declares no rust-version", package["name"])),
        );
        assert_eq!(
            declared, required,
            "{} declares rust-version {declared:?}, but its dependencies need {required:?} \
             (highest: {by}); set `rust-version` in the workspace Cargo.toml to that",
            package["name"]
        );
    }
}
