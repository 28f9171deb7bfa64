//! Malformed pipeline files: every problem is reported with the file, the
//! line and column of the offending stage, edge or field, what is wrong and
//! the fix, and nothing panics or hangs.

use edgeflow_graph::{
    load_file, parse_spec, BuildEnv, Diagnostic, Error, Override, ParamInfo, ParamType, Params,
    PipelineBuilder, PortSpec, PortType, Ports, Registry, Stage, StageError, StageFactory,
    StageInfo,
};
use std::path::PathBuf;

/// A stage kind that is only described, never built.
struct Kind {
    kind: &'static str,
    params: Vec<ParamInfo>,
    ports: Ports,
}

impl StageFactory for Kind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: self.kind,
            doc: "test kind",
            params: self.params.clone(),
            source: self.ports.inputs.is_empty(),
            ports: self.ports.clone(),
        }
    }
    fn build(&self, _p: &Params, _e: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Err(StageError::msg("test kinds are not built"))
    }
}

fn port(name: &str, ty: PortType) -> PortSpec {
    PortSpec::new(name, ty, "")
}

/// A kind whose ports depend on a param `n` (1..=8 outputs), as real
/// factories' ports do (a WAV source's rate, a mixer's channel count).
struct Fanout;

impl StageFactory for Fanout {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "fanout",
            doc: "n outputs",
            params: vec![ParamInfo::new("n", ParamType::Int, 1, "outputs, 1..=8")],
            source: true,
            ports: Ports::default(),
        }
    }
    fn ports(&self, p: &Params, _e: &BuildEnv) -> Result<Ports, StageError> {
        let n: u64 = p.get("n")?;
        if !(1..=8).contains(&n) {
            return Err(p.error("n", format!("must be 1..=8, got {n}")).into());
        }
        Ok(Ports {
            inputs: vec![],
            outputs: (0..n)
                .map(|i| port(&format!("out{i}"), PortType::Text))
                .collect(),
        })
    }
    fn build(&self, _p: &Params, _e: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Err(StageError::msg("test kinds are not built"))
    }
}

/// Builtins plus a small speech chain with typed ports.
fn registry() -> Registry {
    let mut r = Registry::builtin();
    r.register(Fanout);
    r.register(Kind {
        kind: "mic",
        params: vec![],
        ports: Ports {
            inputs: vec![],
            outputs: vec![port("out", PortType::audio_at(16_000))],
        },
    });
    r.register(Kind {
        kind: "asr",
        params: vec![
            ParamInfo::required("model", ParamType::InputPath, "the model weights"),
            ParamInfo::new("beam", ParamType::Int, 1, "beam width"),
        ],
        ports: Ports {
            inputs: vec![port("audio", PortType::audio_at(16_000))],
            outputs: vec![port("text", PortType::Text)],
        },
    });
    r.register(Kind {
        kind: "llm",
        params: vec![],
        ports: Ports {
            inputs: vec![port("prompt", PortType::Tokens)],
            outputs: vec![port("tokens", PortType::Tokens)],
        },
    });
    r.register(Kind {
        kind: "tts",
        params: vec![],
        ports: Ports {
            inputs: vec![port("text", PortType::Text)],
            outputs: vec![port("audio", PortType::audio_at(24_000))],
        },
    });
    r.register(Kind {
        kind: "speaker",
        params: vec![],
        ports: Ports {
            inputs: vec![port("in", PortType::audio_at(16_000))],
            outputs: vec![],
        },
    });
    r
}

/// A pipeline file in its own folder (removed on drop).
struct Case {
    dir: tempfile::TempDir,
    path: PathBuf,
}

fn write(bytes: &[u8]) -> Case {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pipe.yaml");
    std::fs::write(&path, bytes).expect("write");
    Case { dir, path }
}

fn diags_with(case: &Case, overrides: &[&str]) -> Vec<Diagnostic> {
    let overrides: Vec<Override> = overrides
        .iter()
        .map(|s| s.parse().expect("override"))
        .collect();
    match load_file(&case.path, &registry(), &overrides) {
        Err(Error::Invalid(d)) => {
            assert!(!d.is_empty());
            for x in &d {
                assert_eq!(x.file.as_deref(), Some(case.path.as_path()), "{x}");
                assert!(x.fix.is_some(), "every diagnostic has a fix: {x}");
            }
            d
        }
        Err(e) => panic!("expected validation errors, got {e}"),
        Ok(_) => panic!("expected validation errors, the pipeline was accepted"),
    }
}

/// The one diagnostic whose message contains `needle`.
fn find(yaml: &str, overrides: &[&str], needle: &str) -> Diagnostic {
    let case = write(yaml.as_bytes());
    let d = diags_with(&case, overrides);
    let hits: Vec<_> = d.iter().filter(|x| x.message.contains(needle)).collect();
    assert_eq!(hits.len(), 1, "one diagnostic about `{needle}` in {d:#?}");
    hits[0].clone()
}

#[track_caller]
fn at(d: &Diagnostic, line: usize, column: usize) {
    assert_eq!((d.line, d.column), (Some(line), Some(column)), "{d}");
}

#[track_caller]
fn fix_has(d: &Diagnostic, needle: &str) {
    let fix = d.fix.as_deref().unwrap_or("");
    assert!(
        fix.contains(needle),
        "fix `{fix}` should mention `{needle}`"
    );
}

const TICK: &str = "stages:\n  - id: tick\n    kind: timer\n    params: { rate_hz: 10, count: 3 }\n  - id: show\n    kind: stdout\nedges:\n  - from: tick.out\n    to: show.in\n";

#[test]
fn a_valid_pipeline_passes() {
    let case = write(TICK.as_bytes());
    let plan = load_file(&case.path, &registry(), &[]).expect("valid");
    assert_eq!((plan.stages.len(), plan.edges.len()), (2, 1));
    assert_eq!(plan.name, "pipe");
}

#[test]
fn syntax_error_has_line_and_column() {
    let d = find(
        "stages:\n  - id: tick\n    kind: timer\n    params: { rate_hz: 10\nedges: []\n",
        &[],
        "",
    );
    assert!(d.line.is_some() && d.column.is_some(), "{d}");
    assert!(d.line >= Some(4), "{d}");
    fix_has(&d, "YAML");
}

#[test]
fn bad_indentation_is_located() {
    let d = find("stages:\n  - id: tick\n   kind: timer\n", &[], "");
    assert!(d.line.is_some() && d.column.is_some(), "{d}");
}

#[test]
fn unknown_top_level_field() {
    let d = find(&format!("{TICK}edgez: []\n"), &[], "unknown field `edgez`");
    at(&d, 10, 1);
    fix_has(&d, "did you mean `edges`");
}

#[test]
fn unknown_stage_field() {
    let yaml = "stages:\n  - id: tick\n    kind: timer\n    devise: gpu\n";
    let d = find(yaml, &[], "unknown field `devise`");
    at(&d, 4, 5);
    assert_eq!(d.context, "stage `tick`");
    fix_has(&d, "did you mean `device`");
}

#[test]
fn unknown_edge_field() {
    let yaml = TICK.replace("    to: show.in\n", "    to: show.in\n    capcity: 4\n");
    let d = find(&yaml, &[], "unknown field `capcity`");
    at(&d, 10, 5);
    assert_eq!(d.context, "edge `tick.out -> show.in`");
    fix_has(&d, "did you mean `capacity`");
}

#[test]
fn unknown_stage_kind_with_did_you_mean() {
    let d = find(
        &TICK.replace("kind: timer", "kind: timr"),
        &[],
        "unknown stage kind",
    );
    at(&d, 3, 11);
    assert_eq!(d.context, "stage `tick`");
    fix_has(&d, "did you mean `timer`");
}

#[test]
fn each_bad_kind_points_at_its_own_stage() {
    // The same bad text twice, and the id in a comment first: a text search
    // would point both diagnostics at the comment.
    let yaml = "# show and tick, timr\nstages:\n  - id: tick\n    kind: timr\n  - { id: show, kind: timr }\n";
    let case = write(yaml.as_bytes());
    let d = diags_with(&case, &[]);
    assert_eq!(d.len(), 2, "{d:#?}");
    at(&d[0], 4, 11);
    at(&d[1], 5, 23);
    assert_eq!(d[1].context, "stage `show`");
}

#[test]
fn unknown_port_lists_the_valid_ports() {
    let d = find(
        &TICK.replace("from: tick.out", "from: tick.output"),
        &[],
        "no output port",
    );
    at(&d, 8, 11);
    assert!(d.message.contains("`output`"), "{d}");
    fix_has(&d, "`out` (control)");
}

#[test]
fn unknown_stage_in_an_edge() {
    let d = find(
        &TICK.replace("to: show.in", "to: shwo.in"),
        &[],
        "no stage `shwo`",
    );
    at(&d, 9, 9);
    fix_has(&d, "did you mean `show`");
}

#[test]
fn duplicate_stage_id() {
    let yaml = "stages:\n  - id: tick\n    kind: timer\n  - id: tick\n    kind: stdout\n";
    let d = find(yaml, &[], "duplicate stage id");
    at(&d, 4, 9);
    assert!(d.message.contains("first used on line 2"), "{d}");
    fix_has(&d, "unique");
}

#[test]
fn type_mismatch_names_the_stage_to_insert() {
    let yaml = "stages:\n  - id: voice\n    kind: tts\n  - id: out\n    kind: speaker\n  - id: txt\n    kind: text\n    params: { text: hi }\nedges:\n  - { from: txt.out, to: voice.text }\n  - { from: voice.audio, to: out.in }\n";
    let d = find(yaml, &[], "type mismatch");
    at(&d, 11, 5);
    assert_eq!(d.context, "edge `voice.audio -> out.in`");
    assert!(
        d.message.contains("24000 Hz") && d.message.contains("16000 Hz"),
        "{d}"
    );
    fix_has(&d, "resample");
}

#[test]
fn text_into_tokens_asks_for_a_tokenizer() {
    let yaml = "stages:\n  - { id: t, kind: text, params: { text: hi } }\n  - { id: lm, kind: llm }\nedges:\n  - { from: t.out, to: lm.prompt }\n";
    let d = find(yaml, &[], "type mismatch");
    at(&d, 5, 5);
    fix_has(&d, "tokenizer");
}

#[test]
fn dangling_required_input() {
    let yaml = "stages:\n  - id: mic\n    kind: mic\n  - id: out\n    kind: speaker\n";
    let d = find(yaml, &[], "has no incoming edge");
    at(&d, 4, 5);
    assert_eq!(d.context, "stage `out`");
    fix_has(&d, "{ from: mic.out, to: out.in }");
}

#[test]
fn cycle_without_a_back_edge() {
    let yaml = "stages:\n  - { id: tick, kind: timer }\n  - { id: a, kind: passthrough }\n  - { id: b, kind: passthrough }\n  - { id: sink, kind: stdout }\nedges:\n  - { from: tick, to: a }\n  - { from: a, to: b }\n  - { from: b, to: sink }\n  - { from: b, to: a }\n";
    let d = find(yaml, &[], "cycle");
    at(&d, 10, 5);
    assert_eq!(d.context, "edge `b -> a`");
    assert!(d.message.contains("b -> a -> b"), "{d}");
    fix_has(&d, "back_edge: true");
    // Declaring the back-edge makes it valid.
    let ok = yaml.replace("{ from: b, to: a }", "{ from: b, to: a, back_edge: true }");
    let case = write(ok.as_bytes());
    load_file(&case.path, &registry(), &[]).expect("a declared back-edge is fine");
}

#[test]
fn bad_policy() {
    let yaml = TICK.replace(
        "    to: show.in\n",
        "    to: show.in\n    policy: dropoldest\n",
    );
    let d = find(&yaml, &[], "unknown variant `dropoldest`");
    at(&d, 10, 13);
    assert_eq!(d.context, "edge `tick.out -> show.in`");
    fix_has(&d, "did you mean `drop_oldest`");
}

#[test]
fn bad_device() {
    let yaml = "stages:\n  - id: tick\n    kind: timer\n    device: tpu:0\n";
    let d = find(yaml, &[], "bad device");
    assert!(d.message.contains("tpu:0"), "{d}");
    at(&d, 4, 13);
    fix_has(&d, "device: cpu");
}

#[test]
fn capacity_zero_absurd_and_negative() {
    let edge =
        |extra: &str| TICK.replace("    to: show.in\n", &format!("    to: show.in\n{extra}"));
    let d = find(&edge("    capacity: 0\n"), &[], "capacity 0");
    at(&d, 10, 15);
    fix_has(&d, "at least one message");
    let d = find(&edge("    capacity: 10000000\n"), &[], "capacity 10000000");
    at(&d, 10, 15);
    let d = find(&edge("    capacity: -1\n"), &[], "");
    at(&d, 10, 15);
    fix_has(&d, "1..=65536");
}

#[test]
fn bad_max_age() {
    let edge =
        |extra: &str| TICK.replace("    to: show.in\n", &format!("    to: show.in\n{extra}"));
    let d = find(&edge("    max_age: 5 parsecs\n"), &[], "max_age");
    at(&d, 10, 14);
    fix_has(&d, "200ms");
    let d = find(&edge("    max_age: 0ms\n"), &[], "greater than zero");
    at(&d, 10, 14);
}

#[test]
fn threads_out_of_range() {
    let yaml = TICK.replace("    kind: stdout\n", "    kind: stdout\n    threads: 0\n");
    let d = find(&yaml, &[], "threads must be");
    at(&d, 7, 14);
}

#[test]
fn empty_and_comment_only_files() {
    for text in ["", "  \n\n", "# nothing here\n"] {
        let d = find(text, &[], "empty");
        at(&d, 1, 1);
        fix_has(&d, "stages:");
    }
}

#[test]
fn no_stages() {
    let d = find("name: x\nstages: []\n", &[], "no stages");
    at(&d, 2, 1);
}

#[test]
fn non_utf8_bytes() {
    let case = write(b"stages:\n  - id: ab\xff\xfe\n    kind: timer\n");
    let d = diags_with(&case, &[]);
    assert_eq!(d.len(), 1);
    assert!(d[0].message.contains("not UTF-8"), "{}", d[0]);
    at(&d[0], 2, 11);
}

#[test]
fn missing_referenced_file_names_the_resolved_path() {
    let yaml = "stages:\n  - id: mic\n    kind: mic\n  - id: asr\n    kind: asr\n    params:\n      model: models/nope.bin\nedges:\n  - { from: mic, to: asr }\n";
    let case = write(yaml.as_bytes());
    let d = diags_with(&case, &[]);
    assert_eq!(d.len(), 1, "{d:#?}");
    let expected = case.dir.path().join("models/nope.bin");
    assert!(
        d[0].message.contains(&expected.display().to_string()),
        "{}",
        d[0]
    );
    assert!(d[0].message.contains("does not exist"), "{}", d[0]);
    at(&d[0], 7, 14);
    // Once the file exists the pipeline is valid.
    std::fs::create_dir_all(case.dir.path().join("models")).expect("mkdir");
    std::fs::write(&expected, b"weights").expect("write");
    load_file(&case.path, &registry(), &[]).expect("valid once the file exists");
}

#[test]
fn missing_required_param() {
    let yaml = "stages:\n  - id: mic\n    kind: mic\n  - id: asr\n    kind: asr\nedges:\n  - { from: mic, to: asr }\n";
    let d = find(yaml, &[], "missing required param `model`");
    at(&d, 4, 5);
    fix_has(&d, "--set asr.model=VALUE");
}

#[test]
fn wrong_param_type_in_the_file() {
    let d = find(
        &TICK.replace("rate_hz: 10", "rate_hz: fast"),
        &[],
        "param `rate_hz`",
    );
    at(&d, 4, 24);
    assert!(d.message.contains("should be a number"), "{d}");
}

#[test]
fn unknown_param_in_the_file() {
    let d = find(
        &TICK.replace("count: 3", "cont: 3"),
        &[],
        "unknown param `cont`",
    );
    at(&d, 4, 28);
    fix_has(&d, "did you mean `count`");
}

#[test]
fn unknown_set_stage() {
    let d = find(TICK, &["tikc.rate_hz=5"], "no stage `tikc`");
    assert_eq!(d.context, "--set tikc.rate_hz=5");
    at(&d, 1, 1);
    fix_has(&d, "did you mean `tick`");
}

#[test]
fn unknown_set_param() {
    let d = find(TICK, &["tick.rate=5"], "unknown param `rate`");
    assert_eq!(d.context, "stage `tick`, --set tick.rate=5");
    at(&d, 2, 5);
    fix_has(&d, "rate_hz");
}

#[test]
fn wrong_set_param_type() {
    let d = find(TICK, &["tick.count=many"], "param `count`");
    assert_eq!(d.context, "stage `tick`, --set tick.count=many");
    assert!(d.message.contains("whole number"), "{d}");
    at(&d, 2, 5);
}

#[test]
fn set_overrides_apply() {
    let case = write(TICK.as_bytes());
    let o: Vec<Override> = vec!["tick.count=7".parse().expect("override")];
    let plan = load_file(&case.path, &registry(), &o).expect("valid");
    assert_eq!(plan.stages[0].params.get::<u64>("count").expect("count"), 7);
}

#[test]
fn set_overrides_placement_like_a_param() {
    let case = write(TICK.as_bytes());
    let o: Vec<Override> = ["show.device=npu:1", "show.threads=2", "show.inline=true"]
        .iter()
        .map(|s| s.parse().expect("override"))
        .collect();
    let plan = load_file(&case.path, &registry(), &o).expect("valid");
    let show = &plan.stages[1];
    assert_eq!(show.env.device, edgeflow_runtime::DeviceSpec::Npu(1));
    assert_eq!(show.env.threads, 2);
    assert!(show.inline);
    // Not params: the factory never sees them.
    assert!(!show.params.contains("device"), "{:?}", show.params);
    // The file's own placement is what an override replaces.
    let yaml = TICK.replace(
        "    kind: stdout\n",
        "    kind: stdout\n    device: npu\n    threads: 3\n",
    );
    let case = write(yaml.as_bytes());
    let o: Vec<Override> = vec!["show.device=cpu".parse().expect("override")];
    let plan = load_file(&case.path, &registry(), &o).expect("valid");
    assert_eq!(plan.stages[1].env.device, edgeflow_runtime::DeviceSpec::Cpu);
    assert_eq!(plan.stages[1].env.threads, 3);
}

#[test]
fn bad_set_placement_is_located_and_explained() {
    let d = find(TICK, &["show.device=banana"], "bad device `banana`");
    assert_eq!(d.context, "stage `show`, --set show.device=banana");
    at(&d, 5, 5);
    fix_has(&d, "--set show.device=cpu");
    let d = find(TICK, &["show.device=gpu:x"], "bad device `gpu:x`");
    fix_has(&d, "gpu:0");
    for bad in ["0", "999", "two", "-1"] {
        let d = find(TICK, &[&format!("show.threads={bad}")], "threads must be");
        assert_eq!(d.context, format!("stage `show`, --set show.threads={bad}"));
        fix_has(&d, "--set show.threads=N");
    }
    let d = find(TICK, &["show.inline=yes"], "inline must be true or false");
    fix_has(&d, "--set show.inline=true");
    // A kind with its own `device` param gets the override as that param.
    let yaml = "stages:\n  - { id: t, kind: text, params: { text: hi } }\n  - { id: o, kind: devnamed }\nedges:\n  - { from: t.out, to: o.in }\n";
    let case = write(yaml.as_bytes());
    let mut r = registry();
    r.register(Kind {
        kind: "devnamed",
        params: vec![ParamInfo::optional(
            "device",
            ParamType::String,
            "an audio device name",
        )],
        ports: Ports {
            inputs: vec![port("in", PortType::Text)],
            outputs: vec![],
        },
    });
    let o: Vec<Override> = vec!["o.device=banana".parse().expect("override")];
    let plan = load_file(&case.path, &r, &o).expect("a param, not a placement");
    assert_eq!(
        plan.stages[1]
            .params
            .get::<String>("device")
            .expect("device"),
        "banana"
    );
    assert_eq!(plan.stages[1].env.device, edgeflow_runtime::DeviceSpec::Cpu);
}

#[test]
fn missing_field_and_duplicate_key_and_two_documents() {
    let d = find("stages:\n  - id: tick\n", &[], "missing field `kind`");
    at(&d, 2, 5);
    fix_has(&d, "edgeflow stages");
    let d = find(
        "stages:\n  - id: tick\n    kind: timer\n    kind: text\n",
        &[],
        "duplicate key `kind`",
    );
    at(&d, 4, 5);
    let d = find(
        &format!("{TICK}---\n{TICK}"),
        &[],
        "more than one YAML document",
    );
    assert!(d.line >= Some(10), "{d}");
}

#[test]
fn a_yaml_null_kind_says_to_quote_it() {
    let d = find("stages:\n  - id: sink\n    kind: null\n", &[], "YAML null");
    assert_eq!(d.context, "stage `sink`");
    fix_has(&d, "quote it");
}

#[test]
fn not_a_mapping() {
    let d = find("- 1\n- 2\n", &[], "");
    at(&d, 1, 1);
    fix_has(&d, "mapping");
}

#[test]
fn every_problem_is_reported_at_once() {
    let yaml = "stages:\n  - id: tick\n    kind: timr\n  - id: show\n    kind: stdout\n    device: tpu\nedges:\n  - { from: tick.out, to: show.in, capacity: 0 }\n";
    let case = write(yaml.as_bytes());
    let d = diags_with(&case, &[]);
    let lines: Vec<_> = d.iter().map(|x| x.line).collect();
    assert_eq!(lines, vec![Some(3), Some(6), Some(8)], "{d:#?}");
}

#[test]
fn display_names_file_line_column_context_and_fix() {
    let case = write(TICK.replace("kind: timer", "kind: timr").as_bytes());
    let d = diags_with(&case, &[]);
    let text = d[0].to_string();
    let want = format!(
        "{}:3:11: stage `tick`: unknown stage kind `timr`",
        case.path.display()
    );
    assert!(text.starts_with(&want), "{text}");
    assert!(text.contains("\n  fix: did you mean `timer`?"), "{text}");
}

#[test]
fn specs_built_in_code_still_validate() {
    let err = PipelineBuilder::new("code")
        .stage("tick", "timr", serde_json::json!({}))
        .build(&registry())
        .expect_err("unknown kind");
    let Error::Invalid(d) = err else {
        panic!("expected a validation error")
    };
    assert_eq!(d[0].line, None);
    assert!(d[0].message.contains("unknown stage kind"));
}

#[test]
fn alias_bomb_does_not_hang() {
    let mut yaml = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        yaml.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    yaml.push_str("stages: *a11\n");
    assert!(parse_spec(&yaml, None).is_err());
}

/// Truncated and garbled variants of a valid file: each is accepted or
/// rejected with diagnostics, never a panic.
#[test]
fn garbled_files_never_panic() {
    let valid = "name: demo\nstages:\n  - id: tick\n    kind: timer\n    device: cpu\n    params: { rate_hz: 10, count: 3 }\n  - { id: show, kind: stdout, threads: 1 }\nedges:\n  - from: tick.out\n    to: show.in\n    capacity: 4\n    policy: latest\n    max_age: 20ms\n";
    let reg = registry();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("g.yaml");
    let check = |bytes: &[u8]| {
        std::fs::write(&path, bytes).expect("write");
        match load_file(&path, &reg, &[]) {
            Ok(_) => {}
            Err(Error::Invalid(d)) => {
                assert!(!d.is_empty());
                for x in &d {
                    assert!(x.line.is_some() && x.column.is_some(), "unlocated: {x}");
                }
            }
            Err(e) => panic!("unexpected error kind: {e}"),
        }
    };
    let bytes = valid.as_bytes();
    for cut in 0..bytes.len() {
        check(&bytes[..cut]);
    }
    let junk: &[&[u8]] = &[
        b":", b"-", b"{", b"]", b"\"", b"'", b"\t", b"&x", b"*x", b"!!int", b"\n", b" ", b"\xff",
        b"#", b"|", b"%",
    ];
    for i in 0..bytes.len() {
        for j in junk {
            let mut v = bytes[..i].to_vec();
            v.extend_from_slice(j);
            v.extend_from_slice(&bytes[i + 1..]);
            check(&v);
        }
    }
}

#[test]
fn wrong_shapes_say_what_is_expected() {
    let d = find("stages: {}\n", &[], "expected a list");
    at(&d, 1, 9);
    fix_has(&d, "`stages:` is a list of stages");
    let d = find(
        "stages:\n  - id: tick\n    kind: timer\n    threads: many\n",
        &[],
        "whole number",
    );
    at(&d, 4, 14);
    assert_eq!(d.context, "stage `tick`");
    fix_has(&d, "1..=256");
    let d = find(
        "stages:\n  - id: tick\n    kind: timer\n    params: [1, 2]\n",
        &[],
        "expected a mapping",
    );
    at(&d, 4, 13);
    fix_has(&d, "edgeflow stages KIND");
    let d = find(
        &TICK.replace("    to: show.in\n", "    to: show.in\n    max_age: [1]\n"),
        &[],
        "expected a duration",
    );
    at(&d, 10, 14);
    let d = find(
        "stages:\n  - id: tick\n   kind: timer\n",
        &[],
        "missing field `kind`",
    );
    fix_has(&d, "indentation");
}

#[test]
fn a_param_rejected_by_the_factory_is_located() {
    let yaml = "stages:\n  - id: feed\n    kind: host_in\n    params: { type: audo }\n  - { id: show, kind: stdout }\nedges:\n  - { from: feed, to: show }\n";
    let d = find(yaml, &[], "unknown port type `audo`");
    at(&d, 4, 21);
    assert_eq!(d.context, "stage `feed`");
    assert!(d.message.starts_with("param `type`"), "{d}");
}

#[test]
fn yaml_text_without_a_file_is_located_too() {
    let err = edgeflow_graph::Pipeline::from_yaml(
        &TICK.replace("kind: stdout", "kind: stdot"),
        &registry(),
    )
    .expect_err("unknown kind");
    let text = err.to_string();
    assert!(
        text.contains("line 6, column 11: stage `show`: unknown stage kind `stdot`"),
        "{text}"
    );
    assert!(text.contains("did you mean `stdout`"), "{text}");
}

#[test]
fn ports_that_depend_on_params() {
    let yaml = "stages:\n  - id: f\n    kind: fanout\n    params: { n: 0 }\n";
    let d = find(yaml, &[], "must be 1..=8");
    at(&d, 4, 18);
    assert_eq!(d.message, "param `n` must be 1..=8, got 0");
    // A wrongly typed value is reported once, not again by the factory.
    let case = write(yaml.replace("n: 0", "n: two").as_bytes());
    let d = diags_with(&case, &[]);
    assert_eq!(d.len(), 1, "{d:#?}");
    assert!(
        d[0].message.contains("should be a whole number"),
        "{}",
        d[0]
    );
    // Ports that exist only for some values are checked with those values.
    let yaml = "stages:\n  - { id: f, kind: fanout, params: { n: 2 } }\n  - { id: s, kind: stdout }\nedges:\n  - { from: f.out2, to: s }\n";
    let d = find(yaml, &[], "no output port `out2`");
    fix_has(&d, "`out0` (text), `out1` (text)");
    let case = write(yaml.as_bytes());
    let o: Vec<Override> = vec!["f.n=3".parse().expect("override")];
    load_file(&case.path, &registry(), &o).expect("valid with 3 outputs");
}

#[test]
fn deep_nesting_is_refused_not_a_stack_overflow() {
    let deep = format!("stages: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let d = find(&deep, &[], "parser safety limit");
    assert_eq!(d.line, Some(1));
    fix_has(&d, "nesting");
    let deep = format!(
        "stages:\n  - id: a\n    kind: timer\n    params: {{ x: {}1{} }}\n",
        "{a: ".repeat(10_000),
        "}".repeat(10_000)
    );
    let d = find(&deep, &[], "parser safety limit");
    assert_eq!(d.line, Some(4));
}
