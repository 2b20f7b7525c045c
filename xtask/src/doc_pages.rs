//! The workspace's `docs/` pages agree with the code they describe. The pages live outside every
//! published crate, so these checks live here rather than in the crates' own (packaged) tests.

#[cfg(test)]
mod tests {
    use clawgate::config::Config;

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
