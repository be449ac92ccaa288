//! Tidy checks that run as ordinary tests (`cargo test -p xtask`).

#[cfg(test)]
mod names;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    pub(super) fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    pub(super) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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
    pub(super) const SHIPPED: [&str; 7] =
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

    /// Inside the libraries built on the contract, a module names another
    /// module's item by that module's path (`crate::queue::Queue`), never
    /// through the crate root's re-exports (`crate::Queue`): through the
    /// root, every module would import the top of the crate, and its imports
    /// would run up and round in circles (ARCHITECTURE.md, "mongoagent").
    /// So the crate roots define nothing the modules use.
    #[test]
    fn library_modules_import_by_module_path() {
        let mut files = Vec::new();
        for c in ["mongoagent", "mongoelector", "mongolock"] {
            let before = files.len();
            rust_files(&root().join(c).join("src"), &mut files);
            assert!(files.len() > before + 5, "found the sources of {c}");
        }
        let mut offending = Vec::new();
        for f in files.iter().filter(|f| !f.ends_with("src/lib.rs")) {
            let text = std::fs::read_to_string(f).unwrap();
            for (i, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                let through_root = code.match_indices("crate::").any(|(at, m)| {
                    let next = code[at + m.len()..].chars().next();
                    next.is_some_and(|c| c.is_ascii_uppercase() || c == '{')
                });
                if through_root {
                    offending.push(format!("{}:{}: {code}", f.display(), i + 1));
                }
            }
        }
        assert!(offending.is_empty(), "import through the crate root, not a module path:\n{}", offending.join("\n"));
    }

    /// Every async public fn of what ships says what happens when its future is
    /// dropped, as tokio's do: a `pub async fn`, and an `async fn` of a public
    /// trait (which an implementor reads too, to keep the promise).
    #[test]
    fn every_async_public_fn_documents_cancel_safety() {
        let mut missing = Vec::new();
        let mut seen = 0;
        // The conformance suite is test code, in `store-test`, which does not ship.
        for f in shipped_sources() {
            let text = std::fs::read_to_string(&f).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            // The indentation of the public trait whose body this line is in.
            let mut in_trait: Option<usize> = None;
            for (i, line) in lines.iter().enumerate() {
                let t = line.trim_start();
                let indent = line.len() - t.len();
                if in_trait.is_none() && t.starts_with("pub trait ") && !t.ends_with(';') && !t.ends_with('}') {
                    in_trait = Some(indent);
                } else if in_trait == Some(indent) && t.starts_with('}') {
                    in_trait = None;
                }
                let public = t.starts_with(concat!("pub async ", "fn"));
                let in_public_trait = in_trait.is_some_and(|d| indent > d) && t.starts_with(concat!("async ", "fn"));
                if !public && !in_public_trait {
                    continue;
                }
                seen += usize::from(in_public_trait);
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
        assert!(seen > 10, "found the async fns of public traits (the `Store` trait's)");
        assert!(missing.is_empty(), "no `# Cancel safety` section:\n{}", missing.join("\n"));
    }

    /// `ARCHITECTURE.md` is the map a newcomer reads in one sitting: the
    /// bird's-eye view, the code map and the invariants. What takes longer to
    /// read (each invariant in full, how the suites work, measurements) goes
    /// into `docs/` and is linked from it.
    #[test]
    fn architecture_stays_a_map() {
        let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
        let lines = text.lines().count();
        assert!(
            lines < 500,
            "ARCHITECTURE.md has {lines} lines, 500 or more: move the long material into docs/ and link it"
        );
        for heading in ["## Bird's-eye view", "## Code map", "## Invariants"] {
            assert!(text.lines().any(|l| l == heading), "ARCHITECTURE.md lacks `{heading}`");
        }
    }

    /// A product source file holds one concern a reader can take in whole:
    /// past 600 lines it has become two, and is split (a module becomes a
    /// directory with child modules). Test modules (`tests.rs`, `tests/`)
    /// are not product source.
    #[test]
    fn no_product_source_file_passes_600_lines() {
        let mut long = Vec::new();
        for m in members() {
            let mut files = Vec::new();
            rust_files(&root().join(&m).join("src"), &mut files);
            for f in files {
                let test = f.components().any(|c| c.as_os_str() == "tests") || f.ends_with("tests.rs");
                let lines = std::fs::read_to_string(&f).unwrap().lines().count();
                if !test && lines > 600 {
                    long.push(format!("{} ({lines} lines)", f.strip_prefix(root()).unwrap_or(&f).display()));
                }
            }
        }
        assert!(long.is_empty(), "product source files over 600 lines; split them: {long:?}");
    }

    /// The Markdown documents: the root's and `docs/`'s.
    fn markdown_files() -> Vec<PathBuf> {
        let mut files = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
        for e in std::fs::read_dir(root().join("docs")).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "md") {
                files.push(e.path());
            }
        }
        files
    }

    /// Lines outside fenced code blocks.
    fn prose(text: &str) -> Vec<&str> {
        let mut fenced = false;
        let mut out = Vec::new();
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            } else if !fenced {
                out.push(line);
            }
        }
        out
    }

    /// The anchors GitHub gives a document's headings: lower case, letters,
    /// digits, `-` and `_` kept, spaces made `-`, the rest dropped; a repeated
    /// anchor gets `-1`, `-2`, ….
    fn anchors(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashMap::new();
        for line in prose(text) {
            let Some(title) = line.strip_prefix('#') else { continue };
            let title = title.trim_start_matches('#');
            if !title.starts_with(' ') {
                continue;
            }
            let mut slug = String::new();
            for c in title.trim().to_lowercase().chars() {
                if c.is_alphanumeric() || c == '-' || c == '_' {
                    slug.push(c);
                } else if c == ' ' {
                    slug.push('-');
                }
            }
            let n = seen.entry(slug.clone()).or_insert(0);
            out.push(if *n == 0 { slug } else { format!("{slug}-{n}") });
            *n += 1;
        }
        out
    }

    /// Every relative link in the Markdown documents names a file that exists
    /// and, with a `#fragment`, a heading of that file, so moving a section
    /// cannot leave a link behind.
    #[test]
    fn markdown_links_resolve() {
        let mut broken = Vec::new();
        let mut checked = 0;
        for file in markdown_files() {
            let text = std::fs::read_to_string(&file).unwrap();
            for line in prose(&text) {
                for (at, _) in line.match_indices("](") {
                    let rest = &line[at + 2..];
                    let Some(end) = rest.find(')') else { continue };
                    let target = &rest[..end];
                    if target.contains("://") || target.starts_with("mailto:") {
                        continue;
                    }
                    checked += 1;
                    let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
                    let linked = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
                    let shown = format!("{}: ({target})", file.strip_prefix(root()).unwrap_or(&file).display());
                    if !linked.exists() {
                        broken.push(format!("{shown}: no such file"));
                    } else if !fragment.is_empty() {
                        let linked_text = std::fs::read_to_string(&linked).unwrap_or_default();
                        if !anchors(&linked_text).iter().any(|a| a == fragment) {
                            broken.push(format!("{shown}: no heading with that anchor"));
                        }
                    }
                }
            }
        }
        assert!(checked > 20, "found the links");
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    }

    /// Each test server is pinned once, in `store-test/SECANTUS_VERSION`
    /// (Python) and `store-test/SECANTUS_RS_VERSION` (Rust): the harness and
    /// xtask read those files, and no source names either version.
    #[test]
    fn secantus_is_pinned_once() {
        let read = |name: &str| std::fs::read_to_string(root().join("store-test").join(name)).unwrap();
        let (pin, pin_rs) = (read("SECANTUS_VERSION"), read("SECANTUS_RS_VERSION"));
        let (pin, pin_rs) = (pin.trim(), pin_rs.trim());
        for p in [pin, pin_rs] {
            assert!(!p.is_empty() && !p.contains(char::is_whitespace), "one version: {p:?}");
        }
        assert_eq!(crate::server::secantus(), format!("SecantusDB=={pin}"));
        assert_eq!(crate::server::SECANTUS_RS, pin_rs);
        let mut files = Vec::new();
        rust_files(&root(), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(!text.contains(&format!("\"{pin}\"")), "{} names the pinned version: read the pin", f.display());
            assert!(!text.contains(pin_rs), "{} names the Rust server's pinned version: read the pin", f.display());
            assert!(!text.contains(concat!("SecantusDB", "==0")), "{} pins SecantusDB again", f.display());
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
