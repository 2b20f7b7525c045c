//! No import circle between the modules of a crate.
//!
//! A *module* is a top-level file `src/<name>.rs` or directory `src/<name>/` of a crate (both
//! together when both exist); the crate roots `lib.rs` and `main.rs`, and `src/bin/`, are not
//! modules. Module `a` depends on module `b` when a file of `a` names `crate::b` — in a path,
//! a `use` (`use crate::{b, c::d}` too) or a macro's tokens. Comments, doc links and string
//! literals do not count: the source is read as Rust tokens. `super::` paths stay inside their
//! module and are not followed.
//!
//! A circle makes neither module understandable (or removable) without the other; the check
//! prints it with the file behind each arrow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use serde_json::Value;

use crate::cmd::{cargo, project_root, read_stdout};

/// Module → the modules it names, each with the first file (relative to `src`) that does.
pub(crate) type Graph = BTreeMap<String, BTreeMap<String, PathBuf>>;

/// The top-level modules of the crate source directory `src` and their `.rs` files.
pub(crate) fn module_files(src: &Path) -> anyhow::Result<BTreeMap<String, Vec<PathBuf>>> {
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let entries =
        std::fs::read_dir(src).with_context(|| format!("could not list {}", src.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("could not list {}", src.display()))?
            .path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if path.is_dir() {
            if name == "bin" {
                continue;
            }
            let files = modules.entry(name.to_owned()).or_default();
            rust_files(&path, files)?;
        } else if let Some(stem) = name.strip_suffix(".rs")
            && !matches!(stem, "lib" | "main")
        {
            modules.entry(stem.to_owned()).or_default().push(path);
        }
    }
    for files in modules.values_mut() {
        files.sort();
    }
    Ok(modules)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("could not list {}", dir.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("could not list {}", dir.display()))?
            .path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The names that follow `crate::` in `source` (every name of a `crate::{…}` group).
pub(crate) fn crate_references(source: &str) -> anyhow::Result<BTreeSet<String>> {
    let tokens: TokenStream = source
        .parse()
        .map_err(|e| anyhow::anyhow!("not valid Rust tokens: {e}"))?;
    let mut names = BTreeSet::new();
    scan(tokens, &mut names);
    Ok(names)
}

fn scan(stream: TokenStream, names: &mut BTreeSet<String>) {
    let tokens: Vec<TokenTree> = stream.into_iter().collect();
    for (n, token) in tokens.iter().enumerate() {
        match token {
            TokenTree::Group(group) => scan(group.stream(), names),
            TokenTree::Ident(ident) if ident == "crate" && is_path_sep(&tokens[n + 1..]) => {
                match tokens.get(n + 3) {
                    Some(TokenTree::Ident(name)) => insert(names, &name.to_string()),
                    Some(TokenTree::Group(group)) if group.delimiter() == Delimiter::Brace => {
                        use_group(group.stream(), names);
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
}

fn is_path_sep(tokens: &[TokenTree]) -> bool {
    matches!(
        tokens,
        [TokenTree::Punct(a), TokenTree::Punct(b), ..]
            if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':'
    )
}

/// The first name of each comma-separated tree of `crate::{a, b::c, d as e}`.
fn use_group(stream: TokenStream, names: &mut BTreeSet<String>) {
    let mut first = true;
    for token in stream {
        match &token {
            TokenTree::Punct(p) if p.as_char() == ',' => first = true,
            TokenTree::Ident(name) if first => {
                insert(names, &name.to_string());
                first = false;
            }
            TokenTree::Group(group) if first && group.delimiter() == Delimiter::Brace => {
                use_group(group.stream(), names);
                first = false;
            }
            _ => first = false,
        }
    }
}

fn insert(names: &mut BTreeSet<String>, name: &str) {
    let name = name.strip_prefix("r#").unwrap_or(name);
    if name != "self" {
        names.insert(name.to_owned());
    }
}

/// The dependency graph between the top-level modules of `src`.
pub(crate) fn graph(src: &Path) -> anyhow::Result<Graph> {
    let modules = module_files(src)?;
    let mut graph = Graph::new();
    for (module, files) in &modules {
        let edges = graph.entry(module.clone()).or_default();
        for file in files {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("could not read {}", file.display()))?;
            let names =
                crate_references(&text).with_context(|| format!("reading {}", file.display()))?;
            for name in names {
                if name != *module && modules.contains_key(&name) {
                    let relative = file.strip_prefix(src).unwrap_or(file).to_path_buf();
                    edges.entry(name).or_insert(relative);
                }
            }
        }
    }
    Ok(graph)
}

/// One circle of `graph` (`[a, b, a]`: a depends on b, b on a), if there is any.
pub(crate) fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit<'a>(
        graph: &'a Graph,
        module: &'a str,
        marks: &mut BTreeMap<&'a str, Mark>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        marks.insert(module, Mark::Open);
        path.push(module);
        for next in graph.get(module).into_iter().flat_map(BTreeMap::keys) {
            match marks.get(next.as_str()) {
                Some(Mark::Open) => {
                    let start = path.iter().position(|m| m == next)?;
                    let mut cycle: Vec<String> =
                        path[start..].iter().map(|m| (*m).to_owned()).collect();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(cycle) = visit(graph, next, marks, path) {
                        return Some(cycle);
                    }
                }
            }
        }
        path.pop();
        marks.insert(module, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for module in graph.keys() {
        if !marks.contains_key(module.as_str())
            && let Some(cycle) = visit(graph, module, &mut marks, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}

/// What to tell about a circle of the modules of `src`.
pub(crate) fn describe(src: &Path, graph: &Graph, cycle: &[String]) -> String {
    let mut text = format!(
        "import circle between the modules of {}: {}",
        src.display(),
        cycle.join(" -> ")
    );
    for pair in cycle.windows(2) {
        if let Some(file) = graph.get(&pair[0]).and_then(|edges| edges.get(&pair[1])) {
            text.push_str(&format!(
                "\n    {} -> {}: {} names crate::{}",
                pair[0],
                pair[1],
                file.display(),
                pair[1]
            ));
        }
    }
    text.push_str(
        "\n    move what both need into a module of its own, or pass it in from the module that \
         composes them",
    );
    text
}

/// The circle of `src`'s modules, described, if there is one.
pub(crate) fn check_crate(src: &Path) -> anyhow::Result<Option<String>> {
    let graph = graph(src)?;
    Ok(find_cycle(&graph).map(|cycle| describe(src, &graph, &cycle)))
}

/// The `src` directories of the workspace crates, from `cargo metadata --no-deps`.
pub(crate) fn workspace_sources() -> anyhow::Result<Vec<PathBuf>> {
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
    let mut sources = Vec::new();
    for package in packages {
        let manifest = package["manifest_path"]
            .as_str()
            .context("a package without a manifest path")?;
        if let Some(src) = Path::new(manifest).parent().map(|dir| dir.join("src"))
            && src.is_dir()
        {
            sources.push(src);
        }
    }
    sources.sort();
    Ok(sources)
}

/// Checks every workspace crate; fails with each circle found.
pub(crate) fn run() -> anyhow::Result<()> {
    let sources = workspace_sources()?;
    let mut problems = Vec::new();
    for src in &sources {
        let shown = src.strip_prefix(project_root()).unwrap_or(src);
        if let Some(problem) = check_crate(src)? {
            problems
                .push(problem.replace(&src.display().to_string(), &shown.display().to_string()));
        }
    }
    if !problems.is_empty() {
        bail!(
            "tidy found {} import circle(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    println!(
        "tidy: the modules of {} workspace crates have no import circle",
        sources.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph_of(edges: &[(&str, &[&str])]) -> Graph {
        edges
            .iter()
            .map(|(from, to)| {
                let to = to
                    .iter()
                    .map(|t| ((*t).to_owned(), PathBuf::from(format!("{from}.rs"))))
                    .collect();
                ((*from).to_owned(), to)
            })
            .collect()
    }

    #[test]
    fn a_dag_has_no_cycle() {
        let graph = graph_of(&[
            ("serve", &["control", "qa", "gateway"]),
            ("qa", &["control", "views", "gateway"]),
            ("control", &["views", "gateway"]),
            ("views", &["config"]),
            ("gateway", &["config"]),
            ("config", &[]),
        ]);
        assert_eq!(find_cycle(&graph), None);
        assert_eq!(find_cycle(&Graph::new()), None);
    }

    #[test]
    fn a_cycle_is_found_with_its_path() {
        let graph = graph_of(&[
            ("chat", &["control", "gateway"]),
            ("control", &["chat"]),
            ("gateway", &[]),
        ]);
        assert_eq!(
            find_cycle(&graph),
            Some(vec!["chat".into(), "control".into(), "chat".into()])
        );
        let long = graph_of(&[("a", &["b"]), ("b", &["c"]), ("c", &["d"]), ("d", &["b"])]);
        assert_eq!(
            find_cycle(&long),
            Some(vec!["b".into(), "c".into(), "d".into(), "b".into()])
        );
        let own = graph_of(&[("a", &["a"])]);
        assert_eq!(find_cycle(&own), Some(vec!["a".into(), "a".into()]));
    }

    #[test]
    fn references_are_read_from_tokens_not_text() {
        let source = r##"
            //! Links to [`crate::docs_only`] do not count.
            use crate::{alpha, beta::Thing, gamma as g, {delta}};
            use crate::epsilon::{self, Other};
            pub(crate) fn f() -> crate::zeta::T {
                // crate::comment_only
                let _ = "crate::string_only";
                let _ = r#"crate::raw_string_only"#;
                /* crate::block_comment_only */
                tokio::select! { _ = crate::eta::wait() => {} }
                crate::r#type::x();
            }
            macro_rules! m { () => { $crate::theta::y() } }
        "##;
        let names = crate_references(source).expect("valid tokens");
        let expected: BTreeSet<String> = [
            "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "type", "theta",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        assert_eq!(names, expected);
    }

    fn write(root: &Path, path: &str, text: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn a_crate_directory_is_checked_module_by_module() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path();
        write(src, "lib.rs", "pub mod a; pub mod b; use crate::b::X;");
        write(src, "main.rs", "use crate::a::Y;");
        write(src, "bin/tool.rs", "use crate::b::Z;");
        write(src, "a.rs", "mod inner; use crate::b::X;");
        write(src, "a/inner.rs", "use crate::config::C;");
        write(src, "b/mod.rs", "mod page; pub struct X;");
        write(src, "b/page.html", "crate::a");
        write(src, "config.rs", "pub struct C;");
        let modules = module_files(src).expect("lists");
        assert_eq!(
            modules.keys().map(String::as_str).collect::<Vec<_>>(),
            ["a", "b", "config"],
            "crate roots and bin/ are not modules"
        );
        assert_eq!(modules["a"].len(), 2, "a.rs and a/ are one module");
        assert_eq!(check_crate(src).expect("reads"), None, "a DAG passes");

        write(src, "b/page.rs", "fn f() { crate::a::g(); }");
        let problem = check_crate(src).expect("reads").expect("a circle");
        assert!(problem.contains("a -> b -> a"), "{problem}");
        assert!(problem.contains("b/page.rs names crate::a"), "{problem}");
        assert!(problem.contains("a.rs names crate::b"), "{problem}");
    }

    #[test]
    fn unparsable_source_names_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "a.rs", "fn f() { ");
        let error = check_crate(dir.path()).expect_err("unbalanced");
        assert!(format!("{error:#}").contains("a.rs"), "{error:#}");
    }

    #[test]
    fn the_real_workspace_has_no_import_circle() {
        let sources = workspace_sources().expect("cargo metadata runs");
        assert!(
            sources.iter().any(|s| s.ends_with("crates/clawgate/src")),
            "found the gateway crate: {sources:?}"
        );
        let problems: Vec<String> = sources
            .iter()
            .filter_map(|src| check_crate(src).expect("sources are readable"))
            .collect();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
