//! Tidy checks that run as ordinary tests (`cargo test -p xtask`).

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() && name != "target" && !name.starts_with('.') {
                rust_files(&p, out);
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }

    fn members() -> Vec<String> {
        let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
        let start = manifest.find("members = [").unwrap();
        let end = start + manifest[start..].find(']').unwrap();
        manifest[start..end].split('"').skip(1).step_by(2).map(str::to_owned).collect()
    }

    #[test]
    fn every_member_inherits_workspace_settings() {
        for m in members() {
            let toml = std::fs::read_to_string(root().join(&m).join("Cargo.toml")).unwrap();
            for needle in ["version.workspace = true", "edition.workspace = true", "[lints]\nworkspace = true"] {
                assert!(toml.contains(needle), "{m}/Cargo.toml lacks `{needle}`");
            }
        }
    }

    #[test]
    fn no_hidden_failures() {
        let mut files = Vec::new();
        rust_files(&root(), &mut files);
        assert!(files.len() > 10, "found the sources");
        let banned = [
            concat!("#[", "ignore"),
            concat!("#[", "should_panic"),
            concat!("todo", "!("),
            concat!("unimplemented", "!("),
        ];
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for b in banned {
                assert!(!text.contains(b), "{} contains {b}", f.display());
            }
        }
    }

    /// Product crates may name the MongoDB driver or backend only behind their
    /// optional `mongo` feature.
    #[test]
    fn product_crates_use_mongodb_only_behind_the_feature() {
        for c in crate::ci::PRODUCT_CRATES {
            let mut files = Vec::new();
            rust_files(&root().join(c).join("src"), &mut files);
            for f in files {
                let text = std::fs::read_to_string(&f).unwrap();
                let lines: Vec<&str> = text.lines().collect();
                for (i, line) in lines.iter().enumerate() {
                    let code = line.split("//").next().unwrap_or("");
                    if code.contains("mongodb::") || code.contains("store_mongo") {
                        let gated = lines[..i].iter().rev().take(3).any(|l| l.contains("feature = \"mongo\""));
                        assert!(
                            gated,
                            "{}:{}: `{}` is not behind #[cfg(feature = \"mongo\")]",
                            f.display(),
                            i + 1,
                            line.trim()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn readme_gives_the_two_commands_and_ci_calls_the_test_command() {
        let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
        let first_screen: String = readme.lines().take(40).collect::<Vec<_>>().join("\n");
        assert!(first_screen.contains("cargo xtask ci"), "README's first screen gives the test command");
        assert!(
            first_screen.contains("cargo run --release -p mongocoord -- demo"),
            "README's first screen gives the demo command"
        );
        let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
        assert!(ci.contains("cargo xtask ci"), ".ci/run calls the README's test command");
    }
}
