//! The shape of the house: every `crate::` path in src/ goes down the layer list (src/lib.rs,
//! which README's "Code map" follows), so there is no cycle between top-level modules; no source file is over 700 lines;
//! the on-disk names are spelled only in `format`.

use std::path::{Path, PathBuf};

/// The layer list, bottom to top, as src/lib.rs numbers it (`//! N. [`module`]...`): a module
/// may name only modules before it. Its numbering must run 1, 2, 3... without a gap.
fn layers() -> Vec<String> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    let text = std::fs::read_to_string(lib).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("//! ") else {
            continue;
        };
        let Some((n, item)) = rest.split_once(". [`") else {
            continue;
        };
        let Ok(n) = n.parse::<usize>() else {
            continue;
        };
        assert_eq!(
            n,
            out.len() + 1,
            "src/lib.rs's layer list skips a number: {line}"
        );
        out.push(item.split('`').next().unwrap().to_string());
    }
    assert!(out.len() > 10, "src/lib.rs lists no layers: {out:?}");
    out
}

const MAX_LINES: usize = 700;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn src_files() -> Vec<(String, PathBuf)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            (rel, p)
        })
        .collect()
}

/// The top-level module a file of src/ belongs to (`None`: lib.rs, the binaries).
fn module_of(rel: &str) -> Option<&str> {
    let first = rel.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "bin" && name != "main").then_some(name)
}

/// Code without comments: `//` to the end of the line (doc comments included) and string
/// literals are kept out, so a doc link or a message naming a module is not an import.
fn code_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            let mut out = String::new();
            let mut in_str = false;
            let mut prev = ' ';
            let chars: Vec<char> = l.chars().collect();
            let mut k = 0;
            while k < chars.len() {
                let c = chars[k];
                if !in_str && c == '/' && chars.get(k + 1) == Some(&'/') {
                    break;
                }
                if c == '"' && prev != '\\' {
                    in_str = !in_str;
                } else if !in_str {
                    out.push(c);
                }
                prev = c;
                k += 1;
            }
            (i + 1, out)
        })
        .collect()
}

/// Top-level modules a line names through `crate::`, including `crate::{a, b::c}` groups.
fn named_modules(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Only the first segment of each item at the group's top level.
            let mut depth = 0;
            let mut item_start = true;
            let mut word = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_alphanumeric() || c == '_' => {
                        if item_start {
                            word.push(c);
                        }
                        continue;
                    }
                    _ => {}
                }
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                    item_start = false;
                }
            }
            if !word.is_empty() {
                out.push(word);
            }
        } else {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(word);
        }
    }
    out
}

#[test]
fn imports_only_go_down_the_layers() {
    let layers = layers();
    let rank = |m: &str| layers.iter().position(|l| l == m);
    let mut bad = Vec::new();
    for (rel, path) in src_files() {
        let Some(module) = module_of(&rel) else {
            continue;
        };
        let Some(own) = rank(module) else {
            bad.push(format!(
                "src/{rel}: top-level module {module:?} is not in the layer list"
            ));
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in code_lines(&text) {
            for named in named_modules(&line) {
                if named == module || named == "Error" || named == "Result" {
                    continue;
                }
                match rank(&named) {
                    Some(r) if r < own => {}
                    Some(_) => bad.push(format!(
                        "src/{rel}:{n}: {module} names crate::{named}, which is not below it"
                    )),
                    None => {}
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports going up or across the layers:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_source_file_is_over_the_limit() {
    let long: Vec<String> = src_files()
        .into_iter()
        .filter_map(|(rel, p)| {
            let n = std::fs::read_to_string(p).unwrap().lines().count();
            (n > MAX_LINES).then(|| format!("src/{rel}: {n} lines"))
        })
        .collect();
    assert!(
        long.is_empty(),
        "split these along their seams:\n{}",
        long.join("\n")
    );
}

#[test]
fn missing_docs_is_allowed_nowhere() {
    let allowed: Vec<String> = src_files()
        .into_iter()
        .filter(|(_, p)| {
            std::fs::read_to_string(p)
                .unwrap()
                .contains(&format!("allow({})", "missing_docs"))
        })
        .map(|(rel, _)| format!("src/{rel}"))
        .collect();
    assert!(
        allowed.is_empty(),
        "missing_docs allowed in:\n{}",
        allowed.join("\n")
    );
}

#[test]
fn on_disk_names_are_spelled_only_in_format() {
    let spelled: Vec<String> = src_files()
        .into_iter()
        .filter(|(rel, _)| module_of(rel) != Some("format"))
        .filter(|(_, p)| {
            let text = std::fs::read_to_string(p).unwrap();
            text.contains(&format!("\"{}\"", "zarr.json"))
        })
        .map(|(rel, _)| format!("src/{rel}"))
        .collect();
    assert!(
        spelled.is_empty(),
        "\"zarr.json\" spelled outside format/ in:\n{}",
        spelled.join("\n")
    );
}

#[test]
fn the_readme_code_map_follows_the_layer_list() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let map = readme
        .split("## Code map")
        .nth(1)
        .expect("README has a Code map");
    let map = map.split("\n## ").next().unwrap();
    let rows: Vec<String> = map
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" | ").nth(1))
        .filter_map(|cell| {
            let name = cell.trim_matches('`');
            let name = name
                .strip_suffix('/')
                .or_else(|| name.strip_suffix(".rs"))?;
            (name != "bin").then(|| name.to_string())
        })
        .collect();
    assert_eq!(
        rows,
        layers(),
        "README's Code map rows against src/lib.rs's layer list"
    );
}
