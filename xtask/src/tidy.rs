//! `cargo xtask tidy`: the mechanical checks of the architecture's invariants.
//!
//! * **Layering.** [`RULES`] encodes the crate layers of `docs/architecture.md`: which of our
//!   crates each crate may depend on. Every dependency between workspace crates must be an
//!   allowed arrow, and every workspace crate must have a row (exact, or a prefix row such as the
//!   one for every `clawgate-channel-*` crate), so a new kind of crate is placed in a layer
//!   deliberately while one more channel crate needs no new row. Normal and build dependencies
//!   follow a row's `arrows`; dev-dependencies follow its `dev_arrows` as well, since tests may
//!   use testing crates and lower crates the product code does not.
//! * **Publish metadata.** Every publishable library crate carries the crates.io metadata
//!   (docs.rs link included), ships both license texts and inherits the workspace lints.
//!
//! * **Module circles.** No import circle between the top-level modules of a crate
//!   ([`modules`]).
//!
//! The checks are pure functions over plain data ([`check_layers`], [`check_manifests`]); only
//! [`workspace`] does I/O (`cargo metadata` and reading manifests).

use std::fmt;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::cmd::{cargo, read_stdout};

mod modules;

/// Which crate names a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Exact(&'static str),
    /// Every crate whose name starts with this and has no exact row of its own.
    Prefix(&'static str),
}

/// Where a crate sits. Arrows point from a higher layer to a strictly lower one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    /// A product layer, 0 (vocabulary) to 4 (the gateway binary).
    Product(u8),
    /// Test suites other crates' tests run (the adapter conformance suite): above every product
    /// layer, so product code never depends on one, while tests may.
    Testing,
    /// Tools and tests (xtask, the benchmarks, the e2e package): above everything, never depended
    /// upon.
    Tool,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layer::Product(n) => write!(f, "layer {n}"),
            Layer::Testing => f.write_str("testing"),
            Layer::Tool => f.write_str("tools"),
        }
    }
}

/// The crates a crate may depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrows {
    /// Exactly these crates of ours (an empty list: none).
    To(&'static [&'static str]),
    /// Any of our product crates in a strictly lower layer.
    AnyLowerLayer,
    /// Any of our product crates in a strictly lower layer, and any testing crate (the default
    /// for dev-dependencies).
    LowerLayerOrTesting,
    /// Anything in the workspace.
    Any,
}

#[derive(Debug)]
struct Rule {
    pattern: Pattern,
    layer: Layer,
    /// Normal and build dependencies.
    arrows: Arrows,
    /// Dev-dependencies, in addition to `arrows`.
    dev_arrows: Arrows,
}

impl Rule {
    /// A row whose tests may use any lower product crate and any testing crate.
    const fn new(pattern: Pattern, layer: Layer, arrows: Arrows) -> Rule {
        Rule {
            pattern,
            layer,
            arrows,
            dev_arrows: Arrows::LowerLayerOrTesting,
        }
    }

    /// The arrows a dependency of `kind` may follow.
    fn allows(&self, dep: &str, kind: DepKind) -> bool {
        self.arrows.allow(self.layer, dep)
            || (kind == DepKind::Dev && self.dev_arrows.allow(self.layer, dep))
    }

    fn allowed_text(&self, kind: DepKind) -> String {
        match kind {
            DepKind::Dev if self.arrows != self.dev_arrows => format!(
                "{}; in tests also {}",
                self.arrows.text(),
                self.dev_arrows.text()
            ),
            _ => self.arrows.text(),
        }
    }
}

impl Arrows {
    fn allow(self, layer: Layer, dep: &str) -> bool {
        match self {
            Arrows::Any => true,
            Arrows::To(names) => names.contains(&dep),
            Arrows::AnyLowerLayer => rule_for(dep).is_some_and(|target| {
                matches!(target.layer, Layer::Product(_)) && target.layer < layer
            }),
            Arrows::LowerLayerOrTesting => rule_for(dep).is_some_and(|target| match target.layer {
                Layer::Product(_) => target.layer < layer,
                Layer::Testing => true,
                Layer::Tool => false,
            }),
        }
    }

    fn text(self) -> String {
        match self {
            Arrows::To([]) => "none of our crates".into(),
            Arrows::To(names) => names.join(", "),
            Arrows::AnyLowerLayer => "any crate of a lower layer".into(),
            Arrows::LowerLayerOrTesting => "any crate of a lower layer, any testing crate".into(),
            Arrows::Any => "anything".into(),
        }
    }
}

const TYPES: &str = "clawgate-types";
const STORE: &str = "clawgate-store";
/// Every storage backend's name starts with this.
const STORE_BACKEND_PREFIX: &str = "clawgate-store-";
/// The embedded default backend, which tests open their state directories with.
const STORE_SQLITE: &str = "clawgate-store-sqlite";
const SDK: &str = "clawgate-channel-sdk";
const MESSAGES: &str = "clawgate-messages";
pub(crate) const CONFORMANCE: &str = "clawgate-conformance";
/// The property-test inputs of every parser target (no crate of ours below it).
const FUZZ: &str = "clawgate-fuzz";
/// Every channel crate's name starts with this.
const CHANNEL_PREFIX: &str = "clawgate-channel-";

/// The layers of `docs/architecture.md`. Change this table and that page together.
const RULES: &[Rule] = &[
    Rule::new(Pattern::Exact(TYPES), Layer::Product(0), Arrows::To(&[])),
    Rule::new(
        Pattern::Exact(STORE),
        Layer::Product(1),
        Arrows::To(&[TYPES]),
    ),
    // The SDK hands channels the channel-state port (scoped to their account); no backend.
    Rule::new(
        Pattern::Exact(SDK),
        Layer::Product(1),
        Arrows::To(&[TYPES, STORE]),
    ),
    // Storage backends implement the ports beside them; only the binary (and tests, tools)
    // picks one, so no engine links a database driver (see `check_backend_free`).
    Rule::new(
        Pattern::Prefix(STORE_BACKEND_PREFIX),
        Layer::Product(1),
        Arrows::To(&[TYPES, STORE]),
    ),
    Rule::new(
        Pattern::Exact(MESSAGES),
        Layer::Product(2),
        Arrows::To(&[TYPES, STORE, SDK]),
    ),
    Rule::new(
        Pattern::Exact("clawgate-awareness"),
        Layer::Product(2),
        Arrows::To(&[TYPES, STORE]),
    ),
    Rule::new(
        Pattern::Exact("clawgate-acpx"),
        Layer::Product(2),
        Arrows::To(&[TYPES, STORE]),
    ),
    // The wrapper binary stays tiny: none of our crates.
    Rule::new(
        Pattern::Exact("clawgate-acpx-wrapper"),
        Layer::Product(2),
        Arrows::To(&[]),
    ),
    // Every channel crate (the QA one included): adapters see the SDK, never the engine; their
    // tests run the conformance suite, which drives the engine over a store.
    Rule {
        pattern: Pattern::Prefix(CHANNEL_PREFIX),
        layer: Layer::Product(3),
        arrows: Arrows::To(&[TYPES, SDK]),
        dev_arrows: Arrows::To(&[CONFORMANCE, MESSAGES, STORE, STORE_SQLITE]),
    },
    Rule::new(
        Pattern::Exact(CONFORMANCE),
        Layer::Testing,
        Arrows::To(&[TYPES, SDK, MESSAGES, STORE, STORE_SQLITE, FUZZ]),
    ),
    Rule::new(Pattern::Exact(FUZZ), Layer::Testing, Arrows::To(&[])),
    // The turn engine composes the layer-2 engines; it knows no channel crate.
    Rule::new(
        Pattern::Exact("clawgate-turns"),
        Layer::Product(3),
        Arrows::To(&[
            TYPES,
            STORE,
            SDK,
            MESSAGES,
            "clawgate-awareness",
            "clawgate-acpx",
        ]),
    ),
    // The binary may use any channel crate (they are all layer 3).
    Rule::new(
        Pattern::Exact("clawgate"),
        Layer::Product(4),
        Arrows::AnyLowerLayer,
    ),
    Rule::new(Pattern::Exact("xtask"), Layer::Tool, Arrows::Any),
    Rule::new(Pattern::Exact("clawgate-e2e"), Layer::Tool, Arrows::Any),
    // The protocol model checks: only their test ties the model to the real transition table.
    Rule::new(
        Pattern::Exact("clawgate-model"),
        Layer::Tool,
        Arrows::To(&[TYPES]),
    ),
    // The deterministic simulation drives the real message engines on the real store.
    Rule::new(
        Pattern::Exact("clawgate-sim"),
        Layer::Tool,
        Arrows::To(&[
            TYPES,
            STORE,
            STORE_SQLITE,
            SDK,
            MESSAGES,
            "clawgate-awareness",
        ]),
    ),
    // The benchmark suites `cargo xtask bench` runs.
    Rule::new(
        Pattern::Exact("clawgate-benchmarks"),
        Layer::Tool,
        Arrows::Any,
    ),
];

/// The rule for a crate: its exact row, else the longest matching prefix row.
fn rule_for(name: &str) -> Option<&'static Rule> {
    RULES
        .iter()
        .find(|rule| matches!(rule.pattern, Pattern::Exact(exact) if exact == name))
        .or_else(|| {
            RULES
                .iter()
                .filter_map(|rule| match rule.pattern {
                    Pattern::Prefix(prefix) if name.starts_with(prefix) => {
                        Some((prefix.len(), rule))
                    }
                    _ => None,
                })
                .max_by_key(|(len, _)| *len)
                .map(|(_, rule)| rule)
        })
}

/// The kind of a dependency, as `cargo metadata` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DepKind {
    Normal,
    Build,
    Dev,
}

impl fmt::Display for DepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DepKind::Normal => "dependency",
            DepKind::Build => "build-dependency",
            DepKind::Dev => "dev-dependency",
        })
    }
}

/// One workspace crate and its dependencies on other workspace crates.
#[derive(Debug, Clone)]
pub(crate) struct Package {
    pub(crate) name: String,
    pub(crate) deps: Vec<(String, DepKind)>,
    pub(crate) manifest: Manifest,
}

/// The publish facts of one crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Manifest {
    /// `publish` is not `false`.
    pub(crate) publishable: bool,
    /// The crate has a library target.
    pub(crate) is_lib: bool,
    pub(crate) description: bool,
    /// `license` (or `license-file`).
    pub(crate) license: bool,
    pub(crate) repository: bool,
    pub(crate) readme: bool,
    pub(crate) keywords: bool,
    /// `documentation` (the crate's docs.rs page).
    pub(crate) documentation: bool,
    /// `[lints] workspace = true` in its Cargo.toml.
    pub(crate) workspace_lints: bool,
    /// The license texts of [`LICENSE_FILES`] beside its Cargo.toml (copies or symlinks), which
    /// is what puts them into its package.
    pub(crate) license_files: Vec<&'static str>,
}

/// The license texts every publishable crate ships (the workspace is `MIT OR Apache-2.0`).
pub(crate) const LICENSE_FILES: [&str; 2] = ["LICENSE-MIT", "LICENSE-APACHE"];

/// A broken invariant, worded so the reader knows what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Violation {
    UnknownCrate {
        name: String,
    },
    ForbiddenArrow {
        from: String,
        to: String,
        kind: DepKind,
    },
    MissingField {
        name: String,
        field: &'static str,
    },
    LintsNotInherited {
        name: String,
    },
    MissingLicenseFile {
        name: String,
        file: &'static str,
    },
    LinksDriver {
        krate: String,
        driver: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::LinksDriver { krate, driver } => write!(
                f,
                "{krate} links the database driver {driver} (`cargo tree -p {krate} -e normal \
                 -i {driver}`): it must reach the store through clawgate-store's ports only"
            ),
            Violation::UnknownCrate { name } => write!(
                f,
                "{name} is not in the layer table: give it a row in RULES (xtask/src/tidy.rs) \
                 and a place in docs/architecture.md"
            ),
            Violation::ForbiddenArrow { from, to, kind } => {
                let from_rule = rule_for(from);
                let to_rule = rule_for(to);
                let layer =
                    |rule: Option<&Rule>| rule.map_or("unplaced".into(), |r| r.layer.to_string());
                write!(
                    f,
                    "{from} ({}) must not depend on {to} ({}) ({kind}); allowed: {}",
                    layer(from_rule),
                    layer(to_rule),
                    from_rule.map_or("see RULES".into(), |rule| rule.allowed_text(*kind)),
                )
            }
            Violation::MissingField { name, field } => write!(
                f,
                "{name} is publishable but its Cargo.toml does not set `{field}` \
                 (set it, or inherit it with `{field}.workspace = true`)"
            ),
            Violation::LintsNotInherited { name } => {
                write!(f, "{name}'s Cargo.toml lacks `[lints] workspace = true`")
            }
            Violation::MissingLicenseFile { name, file } => write!(
                f,
                "{name} is publishable but its directory has no {file}, so its package would \
                 not carry the license text: add a symlink to the workspace root's {file}"
            ),
        }
    }
}

/// Checks every arrow between workspace crates against [`RULES`].
pub(crate) fn check_layers(packages: &[Package]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for package in packages {
        let Some(rule) = rule_for(&package.name) else {
            violations.push(Violation::UnknownCrate {
                name: package.name.clone(),
            });
            continue;
        };
        for (dep, kind) in &package.deps {
            // A crate's dev-dependency on itself turns on test features; it is not an arrow.
            if *kind == DepKind::Dev && *dep == package.name {
                continue;
            }
            if !rule.allows(dep, *kind) {
                violations.push(Violation::ForbiddenArrow {
                    from: package.name.clone(),
                    to: dep.clone(),
                    kind: *kind,
                });
            }
        }
    }
    violations
}

/// Checks that every publishable library crate can go to crates.io as a good citizen.
pub(crate) fn check_manifests(packages: &[Package]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for package in packages {
        let manifest = &package.manifest;
        if !(manifest.publishable && manifest.is_lib) {
            continue;
        }
        let fields = [
            ("description", manifest.description),
            ("license", manifest.license),
            ("repository", manifest.repository),
            ("readme", manifest.readme),
            ("keywords", manifest.keywords),
            ("documentation", manifest.documentation),
        ];
        for (field, present) in fields {
            if !present {
                violations.push(Violation::MissingField {
                    name: package.name.clone(),
                    field,
                });
            }
        }
        if !manifest.workspace_lints {
            violations.push(Violation::LintsNotInherited {
                name: package.name.clone(),
            });
        }
        for file in LICENSE_FILES {
            if !manifest.license_files.contains(&file) {
                violations.push(Violation::MissingLicenseFile {
                    name: package.name.clone(),
                    file,
                });
            }
        }
    }
    violations
}

/// Whether a Cargo.toml's text says `[lints] workspace = true` (or `lints.workspace = true`).
fn inherits_workspace_lints(manifest: &str) -> bool {
    let mut in_lints = false;
    for line in manifest.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
        if compact.starts_with('[') {
            in_lints = compact == "[lints]";
        } else if (in_lints && compact == "workspace=true") || compact == "lints.workspace=true" {
            return true;
        }
    }
    false
}

/// The workspace crates, from `cargo metadata --no-deps` and their manifests.
/// The names of the packages that are published (`publish` not `false`), sorted.
pub(crate) fn published(packages: &[Package]) -> Vec<String> {
    let mut names: Vec<String> = packages
        .iter()
        .filter(|package| package.manifest.publishable)
        .map(|package| package.name.clone())
        .collect();
    names.sort_unstable();
    names
}

pub(crate) fn workspace() -> anyhow::Result<Vec<Package>> {
    let json = read_stdout(&mut cargo([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ]))?;
    let metadata: Value =
        serde_json::from_str(&json).context("`cargo metadata` printed invalid JSON")?;
    let packages = metadata["packages"]
        .as_array()
        .context("`cargo metadata` output has no `packages` list")?;
    let names: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut result = Vec::new();
    for package in packages {
        let name = package["name"]
            .as_str()
            .context("a package without a name")?
            .to_owned();
        let mut deps = Vec::new();
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let dep_name = dep["name"]
                .as_str()
                .context("a dependency without a name")?;
            if !names.contains(&dep_name) {
                continue;
            }
            let kind = match dep["kind"].as_str() {
                None | Some("normal") => DepKind::Normal,
                Some("build") => DepKind::Build,
                Some("dev") => DepKind::Dev,
                Some(other) => bail!("{name}: unknown dependency kind `{other}` for {dep_name}"),
            };
            deps.push((dep_name.to_owned(), kind));
        }
        let manifest_path = PathBuf::from(
            package["manifest_path"]
                .as_str()
                .context("a package without a manifest path")?,
        );
        let manifest_text = std::fs::read_to_string(&manifest_path)
            .with_context(|| format!("could not read {}", manifest_path.display()))?;
        let set = |key: &str| {
            package[key]
                .as_str()
                .is_some_and(|text| !text.trim().is_empty())
        };
        let manifest = Manifest {
            // `publish = false` shows up as an empty registry list; null means "anywhere".
            publishable: !package["publish"].as_array().is_some_and(Vec::is_empty),
            is_lib: package["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|target| {
                    target["kind"].as_array().into_iter().flatten().any(|kind| {
                        matches!(kind.as_str(), Some("lib" | "rlib" | "dylib" | "proc-macro"))
                    })
                }),
            description: set("description"),
            license: set("license") || set("license_file"),
            repository: set("repository"),
            readme: set("readme"),
            keywords: package["keywords"]
                .as_array()
                .is_some_and(|k| !k.is_empty()),
            documentation: set("documentation"),
            workspace_lints: inherits_workspace_lints(&manifest_text),
            // `is_file` follows symlinks: a dangling one would package nothing.
            license_files: LICENSE_FILES
                .into_iter()
                .filter(|file| {
                    manifest_path
                        .parent()
                        .is_some_and(|dir| dir.join(file).is_file())
                })
                .collect(),
        };
        result.push(Package {
            name,
            deps,
            manifest,
        });
    }
    Ok(result)
}

/// Crates that reach the store only through its ports: none may link a database driver, even
/// through a dependency outside the workspace.
const BACKEND_FREE: &[&str] = &[
    TYPES,
    STORE,
    SDK,
    MESSAGES,
    "clawgate-awareness",
    "clawgate-acpx",
    "clawgate-turns",
];
/// The database drivers the backends link.
const DRIVERS: &[&str] = &["rusqlite", "libsqlite3-sys", "tokio-postgres"];

/// Each backend-free crate's normal dependency tree (all features), as `cargo tree -i` sees it.
fn check_backend_free() -> anyhow::Result<Vec<Violation>> {
    let mut violations = Vec::new();
    for krate in BACKEND_FREE {
        for driver in DRIVERS {
            let output = cargo([
                "tree",
                "-p",
                krate,
                "-e",
                "normal",
                "--all-features",
                "-i",
                driver,
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .context("could not start `cargo tree`")?;
            let stderr = String::from_utf8_lossy(&output.stderr);
            // A driver absent from the whole lock file "did not match any packages": clean.
            let tree = if output.status.success() {
                String::from_utf8_lossy(&output.stdout).into_owned()
            } else if stderr.contains("did not match any packages") {
                String::new()
            } else {
                bail!("`cargo tree -p {krate} -i {driver}` failed: {stderr}");
            };
            if !tree.trim().is_empty() {
                violations.push(Violation::LinksDriver {
                    krate: (*krate).to_owned(),
                    driver: (*driver).to_owned(),
                });
            }
        }
    }
    Ok(violations)
}

pub(crate) fn run() -> anyhow::Result<()> {
    modules::run()?;
    let packages = workspace()?;
    let mut violations = check_layers(&packages);
    violations.extend(check_manifests(&packages));
    violations.extend(check_backend_free()?);
    if violations.is_empty() {
        println!(
            "tidy: {} workspace crates respect the layers and publish rules",
            packages.len()
        );
        return Ok(());
    }
    let list: Vec<String> = violations.iter().map(|v| format!("  {v}")).collect();
    bail!(
        "tidy found {} problem(s):\n{}",
        violations.len(),
        list.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete_manifest() -> Manifest {
        Manifest {
            publishable: true,
            is_lib: true,
            description: true,
            license: true,
            repository: true,
            readme: true,
            keywords: true,
            documentation: true,
            workspace_lints: true,
            license_files: LICENSE_FILES.to_vec(),
        }
    }

    fn package(name: &str, deps: &[(&str, DepKind)]) -> Package {
        Package {
            name: name.to_owned(),
            deps: deps
                .iter()
                .map(|(dep, kind)| ((*dep).to_owned(), *kind))
                .collect(),
            manifest: complete_manifest(),
        }
    }

    fn arrow(from: &str, to: &str, kind: DepKind) -> Violation {
        Violation::ForbiddenArrow {
            from: from.into(),
            to: to.into(),
            kind,
        }
    }

    #[test]
    fn the_real_workspace_is_tidy() {
        let packages = workspace().expect("cargo metadata runs");
        assert!(
            packages.iter().any(|p| p.name == TYPES),
            "found the workspace crates"
        );
        let mut violations = check_layers(&packages);
        violations.extend(check_manifests(&packages));
        let text: Vec<String> = violations.iter().map(ToString::to_string).collect();
        assert!(
            violations.is_empty(),
            "tidy violations:\n{}",
            text.join("\n")
        );
    }

    #[test]
    fn the_architecture_graph_is_allowed() {
        use DepKind::*;
        let packages = [
            package(TYPES, &[]),
            package(STORE, &[(TYPES, Normal), (STORE, Dev)]),
            package(SDK, &[(TYPES, Normal)]),
            package(MESSAGES, &[(TYPES, Normal), (STORE, Normal), (SDK, Normal)]),
            package("clawgate-awareness", &[(TYPES, Normal), (STORE, Normal)]),
            package("clawgate-acpx", &[(TYPES, Normal), (STORE, Build)]),
            package("clawgate-acpx-wrapper", &[]),
            package("clawgate-channel-qa", &[(TYPES, Normal), (SDK, Normal)]),
            package("clawgate-channel-telegram", &[(SDK, Normal), (TYPES, Dev)]),
            package(
                "clawgate-conformance",
                &[(SDK, Normal), (MESSAGES, Normal), (STORE, Dev)],
            ),
            package(
                "clawgate-turns",
                &[
                    (MESSAGES, Normal),
                    ("clawgate-awareness", Normal),
                    ("clawgate-acpx", Normal),
                    (SDK, Dev),
                ],
            ),
            package(
                "clawgate",
                &[
                    (MESSAGES, Normal),
                    ("clawgate-channel-qa", Normal),
                    ("clawgate-turns", Normal),
                ],
            ),
            package("xtask", &[(TYPES, Normal), ("clawgate", Normal)]),
            package("clawgate-e2e", &[("clawgate", Dev), (STORE, Normal)]),
            package(
                "clawgate-benchmarks",
                &[
                    (STORE, Normal),
                    (MESSAGES, Normal),
                    ("clawgate-channel-qa", Normal),
                ],
            ),
        ];
        assert_eq!(check_layers(&packages), []);
    }

    #[test]
    fn forbidden_arrows_are_reported() {
        use DepKind::*;
        let cases: &[(&str, Package, Vec<Violation>)] = &[
            (
                "types -> store",
                package(TYPES, &[(STORE, Normal)]),
                vec![arrow(TYPES, STORE, Normal)],
            ),
            (
                "adapter -> engine",
                package(
                    "clawgate-channel-slack",
                    &[(SDK, Normal), (MESSAGES, Normal)],
                ),
                vec![arrow("clawgate-channel-slack", MESSAGES, Normal)],
            ),
            (
                "a channel crate -> store, as a normal dependency",
                package("clawgate-channel-matrix", &[(SDK, Normal), (STORE, Normal)]),
                vec![arrow("clawgate-channel-matrix", STORE, Normal)],
            ),
            (
                "a channel crate -> awareness, even in tests",
                package("clawgate-channel-qa", &[("clawgate-awareness", Dev)]),
                vec![arrow("clawgate-channel-qa", "clawgate-awareness", Dev)],
            ),
            (
                "a channel crate -> the conformance suite, outside tests",
                package("clawgate-channel-irc", &[(CONFORMANCE, Normal)]),
                vec![arrow("clawgate-channel-irc", CONFORMANCE, Normal)],
            ),
            (
                "product code -> the conformance suite",
                package("clawgate", &[(CONFORMANCE, Normal)]),
                vec![arrow("clawgate", CONFORMANCE, Normal)],
            ),
            (
                "a test -> a higher layer",
                package(STORE, &[(MESSAGES, Dev)]),
                vec![arrow(STORE, MESSAGES, Dev)],
            ),
            (
                "a test -> a tool",
                package(MESSAGES, &[("clawgate-e2e", Dev)]),
                vec![arrow(MESSAGES, "clawgate-e2e", Dev)],
            ),
            (
                "store -> sdk (same layer)",
                package(STORE, &[(SDK, Build)]),
                vec![arrow(STORE, SDK, Build)],
            ),
            (
                "wrapper -> types",
                package("clawgate-acpx-wrapper", &[(TYPES, Normal)]),
                vec![arrow("clawgate-acpx-wrapper", TYPES, Normal)],
            ),
            (
                "the turn engine -> a channel crate (same layer)",
                package(
                    "clawgate-turns",
                    &[(MESSAGES, Normal), ("clawgate-channel-qa", Normal)],
                ),
                vec![arrow("clawgate-turns", "clawgate-channel-qa", Normal)],
            ),
            (
                "the turn engine -> the binary",
                package("clawgate-turns", &[("clawgate", Dev)]),
                vec![arrow("clawgate-turns", "clawgate", Dev)],
            ),
            (
                "binary -> a tool",
                package("clawgate", &[(TYPES, Normal), ("xtask", Normal)]),
                vec![arrow("clawgate", "xtask", Normal)],
            ),
            (
                "a self-dependency that is not a dev-dependency",
                package(TYPES, &[(TYPES, Normal)]),
                vec![arrow(TYPES, TYPES, Normal)],
            ),
        ];
        for (case, package, expected) in cases {
            assert_eq!(
                &check_layers(std::slice::from_ref(package)),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn tests_may_use_testing_crates_and_lower_crates() {
        use DepKind::*;
        let packages = [
            // Any channel crate, with no row of its own: the conformance suite over the engine.
            package(
                "clawgate-channel-discord",
                &[
                    (TYPES, Normal),
                    (SDK, Normal),
                    (CONFORMANCE, Dev),
                    (MESSAGES, Dev),
                    (STORE, Dev),
                ],
            ),
            // A lower crate the product code does not depend on.
            package("clawgate-awareness", &[(STORE, Normal), (SDK, Dev)]),
            package(MESSAGES, &[(STORE, Normal), (CONFORMANCE, Dev)]),
            // The binary may depend on any channel crate.
            package(
                "clawgate",
                &[
                    ("clawgate-channel-qa", Normal),
                    ("clawgate-channel-telegram", Normal),
                    (CONFORMANCE, Dev),
                ],
            ),
        ];
        assert_eq!(check_layers(&packages), []);
    }

    #[test]
    fn a_dev_arrow_message_names_what_tests_may_use() {
        let text = arrow("clawgate-channel-slack", "clawgate-acpx", DepKind::Dev).to_string();
        assert_eq!(
            text,
            "clawgate-channel-slack (layer 3) must not depend on clawgate-acpx (layer 2) \
             (dev-dependency); allowed: clawgate-types, clawgate-channel-sdk; in tests also \
             clawgate-conformance, clawgate-messages, clawgate-store, clawgate-store-sqlite"
        );
    }

    #[test]
    fn an_unknown_crate_is_reported() {
        let packages = [
            package(TYPES, &[]),
            package("clawgate-telemetry", &[(TYPES, DepKind::Normal)]),
        ];
        assert_eq!(
            check_layers(&packages),
            [Violation::UnknownCrate {
                name: "clawgate-telemetry".into()
            }]
        );
        let message = check_layers(&packages)[0].to_string();
        assert!(
            message.contains("clawgate-telemetry is not in the layer table"),
            "{message}"
        );
    }

    #[test]
    fn exact_rows_win_over_prefixes() {
        let sdk = rule_for(SDK).expect("sdk has a rule");
        assert_eq!(sdk.layer, Layer::Product(1));
        let qa = rule_for("clawgate-channel-qa").expect("qa has a rule");
        assert_eq!(qa.layer, Layer::Product(3));
        assert!(rule_for("clawgate-chan").is_none());
    }

    /// The table itself respects the layering: every explicit arrow points strictly down.
    #[test]
    fn every_listed_arrow_points_down() {
        for rule in RULES {
            if let Arrows::To(names) = rule.arrows {
                for name in names {
                    let target = rule_for(name).expect("arrow targets have rows");
                    // An arrow within a layer: a storage backend implements the ports beside it
                    // (both layer 1, so every engine may test on a backend).
                    let backend_to_ports =
                        matches!(rule.pattern, Pattern::Prefix(STORE_BACKEND_PREFIX))
                            && *name == STORE;
                    // And one between testing crates: the contract suite hands channel crates
                    // the fuzz inputs, which depend on none of our crates (no circle).
                    let suite_to_fuzz =
                        rule.pattern == Pattern::Exact(CONFORMANCE) && *name == FUZZ;
                    // And the SDK hands each channel the channel-state port beside it.
                    let sdk_to_ports = rule.pattern == Pattern::Exact(SDK) && *name == STORE;
                    assert!(
                        target.layer < rule.layer
                            || backend_to_ports
                            || suite_to_fuzz
                            || sdk_to_ports,
                        "{:?} -> {name}",
                        rule.pattern
                    );
                }
            }
        }
    }

    #[test]
    fn the_message_names_the_layers_and_the_allowed_arrows() {
        let text = arrow("clawgate-channel-slack", MESSAGES, DepKind::Normal).to_string();
        assert_eq!(
            text,
            "clawgate-channel-slack (layer 3) must not depend on clawgate-messages (layer 2) \
             (dependency); allowed: clawgate-types, clawgate-channel-sdk"
        );
    }

    #[test]
    fn missing_publish_metadata_is_reported() {
        let mut incomplete = package("clawgate-awareness", &[]);
        incomplete.manifest.keywords = false;
        incomplete.manifest.readme = false;
        incomplete.manifest.workspace_lints = false;
        incomplete.manifest.documentation = false;
        incomplete.manifest.license_files = vec!["LICENSE-MIT"];
        let mut private = package("clawgate-e2e", &[]);
        private.manifest = Manifest {
            publishable: false,
            ..incomplete.manifest.clone()
        };
        let mut binary = package("clawgate-acpx-wrapper", &[]);
        binary.manifest = Manifest {
            is_lib: false,
            ..incomplete.manifest.clone()
        };
        let complete = package(TYPES, &[]);

        let name = String::from("clawgate-awareness");
        assert_eq!(
            check_manifests(&[incomplete, private, binary, complete]),
            [
                Violation::MissingField {
                    name: name.clone(),
                    field: "readme"
                },
                Violation::MissingField {
                    name: name.clone(),
                    field: "keywords"
                },
                Violation::MissingField {
                    name: name.clone(),
                    field: "documentation"
                },
                Violation::LintsNotInherited { name: name.clone() },
                Violation::MissingLicenseFile {
                    name,
                    file: "LICENSE-APACHE"
                },
            ]
        );
    }

    #[test]
    fn workspace_lints_are_read_from_the_manifest_text() {
        let cases = [
            (
                "[package]\nname = \"a\"\n\n[lints]\nworkspace = true\n",
                true,
            ),
            ("[lints]\n  workspace=true # inherit\n", true),
            ("lints.workspace = true\n", true),
            ("[package]\nworkspace = true\n", false),
            ("[lints]\nworkspace = false\n", false),
            ("[lints.rust]\nworkspace = true\n", false),
            ("# [lints]\n# workspace = true\n", false),
            ("", false),
        ];
        for (text, expected) in cases {
            assert_eq!(inherits_workspace_lints(text), expected, "{text:?}");
        }
    }
}
