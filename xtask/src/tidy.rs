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

    /// The library crates and the binary: what users run.
    const SHIPPED: [&str; 7] =
        ["store-trait", "store-memory", "store-mongo", "mongolock", "mongoelector", "mongoagent", "mongocoord"];

    fn shipped_sources() -> Vec<PathBuf> {
        let mut files = Vec::new();
        for c in SHIPPED {
            rust_files(&root().join(c).join("src"), &mut files);
        }
        files
    }

    /// One mutex, which cannot be poisoned: no `std::sync::Mutex` and no
    /// hand-written recovery from poisoning in what ships.
    #[test]
    fn one_mutex_without_poisoning() {
        let files = shipped_sources();
        assert!(files.len() > 10, "found the sources");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for b in [concat!("std::sync::", "Mutex"), concat!("p.into_", "inner())"), concat!("sync::{Arc, ", "Mutex")]
            {
                assert!(!text.contains(b), "{} uses `{b}`: use parking_lot::Mutex", f.display());
            }
        }
    }

    /// Every async public fn of what ships says what happens when its future is
    /// dropped, as tokio's do.
    #[test]
    fn every_async_public_fn_documents_cancel_safety() {
        let mut missing = Vec::new();
        // The conformance suites (`testing.rs`) are test code: their module says it once.
        for f in shipped_sources().into_iter().filter(|f| !f.ends_with("testing.rs")) {
            let text = std::fs::read_to_string(&f).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                if !line.trim_start().starts_with(concat!("pub async ", "fn")) {
                    continue;
                }
                let documented = lines[..i]
                    .iter()
                    .rev()
                    .take_while(|l| {
                        let t = l.trim_start();
                        t.starts_with("///") || t.starts_with("#[")
                    })
                    .any(|l| l.contains("# Cancel safety"));
                if !documented {
                    missing.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
        assert!(missing.is_empty(), "no `# Cancel safety` section:\n{}", missing.join("\n"));
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
