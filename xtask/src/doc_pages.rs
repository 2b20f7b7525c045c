//! The workspace's `docs/` pages agree with the code they describe. The pages live outside every
//! published crate, so these checks live here rather than in the crates' own (packaged) tests.

#[cfg(test)]
mod tests {
    use clawgate::config::Config;

    /// The code blocks of `page` whose info string names a file (`rust title=PATH`), with it.
    fn titled_blocks(page: &str) -> Vec<(String, String)> {
        let mut blocks = Vec::new();
        let mut lines = page.lines();
        while let Some(line) = lines.next() {
            let Some(path) = line
                .strip_prefix("```")
                .and_then(|info| info.split_once("title="))
                .map(|(_, path)| path.trim().to_owned())
            else {
                continue;
            };
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push((path, body.join("\n")));
        }
        blocks
    }

    #[test]
    fn the_channel_guide_shows_the_template_crate_verbatim() {
        let page = include_str!("../../docs/channels.md");
        let blocks = titled_blocks(page);
        assert!(
            blocks.len() >= 3,
            "docs/channels.md shows the template's manifest, source and conformance test"
        );
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (path, shown) in blocks {
            let file = std::fs::read_to_string(root.join(&path)).unwrap_or_else(|e| {
                panic!("docs/channels.md shows {path}, which is unreadable: {e}")
            });
            assert_eq!(
                shown,
                file.trim_end_matches('\n'),
                "docs/channels.md's copy of {path} differs from the file: update the page"
            );
        }
    }

    #[test]
    fn the_documented_configuration_reference_is_the_defaults() {
        let page = include_str!("../../docs/configuration.md");
        let reference = page
            .split("## Reference")
            .nth(1)
            .and_then(|rest| rest.split("```toml").nth(1))
            .and_then(|block| block.split("```").next())
            .expect("a toml block under ## Reference");
        let parsed = Config::parse(reference, "docs/configuration.md").expect("parses");
        assert_eq!(parsed, Config::default());
    }
}
