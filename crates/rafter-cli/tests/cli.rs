//! End-to-end tests of the `rafter` binary: the BERT-like fixture against ONNX Runtime's
//! saved outputs at two sequence lengths from one import and from one compiled artifact,
//! `plan`, `devices` and `--trace` output, and the input, artifact and argument errors.

use rafter_reference::npy::{read_npy, write_npy};
use rafter_reference::Tensor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/bert_tiny")
        .join(rel)
}

fn rafter(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rafter"))
        .args(args)
        .output()
        .expect("the rafter binary runs")
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rafter-cli-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Max |a - b| over two f32 tensors of the same shape.
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn bert_tiny_matches_onnx_runtime_at_two_sequence_lengths() {
    let model = fixture("model.onnx");
    for seq in ["seq7", "seq13"] {
        let out = tmpdir(seq);
        let ids = format!(
            "input_ids={}",
            fixture(&format!("{seq}/input_ids.npy")).display()
        );
        let mask = format!(
            "attention_mask={}",
            fixture(&format!("{seq}/attention_mask.npy")).display()
        );
        let o = rafter(&[
            "run",
            model.to_str().unwrap(),
            "--input",
            &ids,
            "--input",
            &mask,
            "--output-dir",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let got = read_npy(&out.join("last_hidden_state.npy")).unwrap();
        let want = read_npy(&fixture(&format!("{seq}/last_hidden_state.npy"))).unwrap();
        let diff = max_abs_diff(&got, &want);
        assert!(diff < 1e-4, "{seq}: max abs diff {diff} vs ONNX Runtime");
    }
}

#[test]
fn demo_runs_without_arguments() {
    let o = rafter(&["run", "--seed", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("output last_hidden_state: f32[1, 8, 32]"),
        "{}",
        text(&o)
    );
}

#[test]
fn wrong_input_dtype_is_an_error() {
    let dir = tmpdir("dtype");
    let bad = dir.join("ids.npy");
    write_npy(&bad, &Tensor::f32s(&[1, 7], vec![0.0; 7])).unwrap();
    let o = rafter(&[
        "run",
        fixture("model.onnx").to_str().unwrap(),
        "--input",
        &format!("input_ids={}", bad.display()),
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("input `input_ids`")
            && text(&o).contains("dtype f32 but i64 is expected"),
        "{}",
        text(&o)
    );
}

#[test]
fn wrong_input_rank_is_an_error() {
    let dir = tmpdir("rank");
    let bad = dir.join("ids.npy");
    write_npy(&bad, &Tensor::i64s(&[7], vec![1; 7])).unwrap();
    let o = rafter(&[
        "run",
        fixture("model.onnx").to_str().unwrap(),
        "--input",
        &format!("input_ids={}", bad.display()),
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("rank 1") && text(&o).contains("rank 2"),
        "{}",
        text(&o)
    );
}

#[test]
fn dim_contradicting_its_symbol_is_an_error() {
    // input_ids has seq = 7, attention_mask seq = 13: `seq` cannot be both.
    let ids = format!("input_ids={}", fixture("seq7/input_ids.npy").display());
    let mask = format!(
        "attention_mask={}",
        fixture("seq13/attention_mask.npy").display()
    );
    let o = rafter(&[
        "run",
        fixture("model.onnx").to_str().unwrap(),
        "--input",
        &ids,
        "--input",
        &mask,
    ]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("symbol `seq` is 7") || t.contains("symbol `batch` is 1"),
        "{t}"
    );
}

#[test]
fn unknown_input_name_and_missing_dims_are_errors() {
    let o = rafter(&[
        "run",
        fixture("model.onnx").to_str().unwrap(),
        "--input",
        "nope=x.npy",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("the model has no input `nope` (inputs: input_ids, attention_mask)"),
        "{}",
        text(&o)
    );
    let o = rafter(&[
        "run",
        fixture("model.onnx").to_str().unwrap(),
        "--dim",
        "batch=1",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--dim seq=N"), "{}", text(&o));
}

#[test]
fn missing_model_file_is_an_error() {
    let o = rafter(&["run", "/nonexistent/model.onnx"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("/nonexistent/model.onnx"), "{}", text(&o));
}

/// `run` arguments feeding the fixture's inputs at `seq` (`seq7`, `seq13`).
fn fixture_inputs(seq: &str) -> Vec<String> {
    ["input_ids", "attention_mask"]
        .iter()
        .flat_map(|name| {
            [
                "--input".to_string(),
                format!("{name}={}", fixture(&format!("{seq}/{name}.npy")).display()),
            ]
        })
        .collect()
}

/// Compiles the fixture with `--dim seq<=64` into `dir/name` and returns the path.
fn compile_fixture(dir: &Path, name: &str) -> PathBuf {
    compile_fixture_with(dir, name, &[])
}

/// [`compile_fixture`] with `extra` compile flags.
fn compile_fixture_with(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let rfa = dir.join(name);
    let model = fixture("model.onnx");
    let mut args = vec![
        "compile",
        model.to_str().unwrap(),
        "-o",
        rfa.to_str().unwrap(),
        "--dim",
        "seq<=64",
    ];
    args.extend(extra);
    let o = rafter(&args);
    assert!(o.status.success(), "{}", text(&o));
    rfa
}

/// Runs `model` on the fixture's inputs at `seq`; returns its output's largest absolute
/// difference from ONNX Runtime's, and the run's text.
fn run_against_ort(model: &Path, seq: &str, extra: &[&str]) -> (f64, String) {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let out = tmpdir(&format!("out-{}", RUNS.fetch_add(1, Ordering::Relaxed)));
    let mut args = vec!["run".to_string(), model.display().to_string()];
    args.extend(fixture_inputs(seq));
    args.extend(["--output-dir".to_string(), out.display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let o = rafter(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", text(&o));
    let got = read_npy(&out.join("last_hidden_state.npy")).unwrap();
    let want = read_npy(&fixture(&format!("{seq}/last_hidden_state.npy"))).unwrap();
    (max_abs_diff(&got, &want), text(&o))
}

/// Runs `model` on the fixture's inputs at `seq` and compares with ONNX Runtime's output.
fn run_matches_ort(model: &Path, seq: &str, extra: &[&str]) -> String {
    let (diff, t) = run_against_ort(model, seq, extra);
    assert!(diff < 1e-4, "{seq}: max abs diff {diff} vs ONNX Runtime");
    t
}

#[test]
fn one_compiled_artifact_matches_onnx_runtime_at_two_sequence_lengths() {
    let dir = tmpdir("compile");
    let o = rafter(&[
        "compile",
        fixture("model.onnx").to_str().unwrap(),
        "-o",
        dir.join("bert.rfa").to_str().unwrap(),
        "--dim",
        "seq<=64",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let summary = String::from_utf8_lossy(&o.stdout);
    for part in ["kernels,", "weight bytes,", "artifact bytes,"] {
        assert!(summary.contains(part), "{summary}");
    }
    // The progress bar is for terminals only: nothing of it reaches a pipe.
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rfa = dir.join("bert.rfa");
    for seq in ["seq7", "seq13"] {
        let t = run_matches_ort(&rfa, seq, &[]);
        assert!(t.contains("(runtime,"), "{t}");
    }
}

#[test]
fn memory_report_shows_weights_as_mapped_pages() {
    let dir = tmpdir("memreport");
    let rfa = compile_fixture(&dir, "tiny.rfa");
    let t = run_matches_ort(&rfa, "seq7", &["--memory-report"]);
    for when in ["after load", "after session open", "after call"] {
        let line = t
            .lines()
            .find(|l| l.starts_with(&format!("memory {when}: rss ")))
            .unwrap_or_else(|| panic!("no `memory {when}` line in\n{t}"));
        assert!(
            line.contains("file-backed") && line.contains("peak"),
            "{line}"
        );
    }
}

#[test]
fn artifacts_are_told_by_content_not_extension() {
    let dir = tmpdir("magic");
    // An artifact named like an ONNX model still runs as an artifact.
    let rfa = compile_fixture(&dir, "looks_like.onnx");
    let t = run_matches_ort(&rfa, "seq7", &[]);
    assert!(t.contains("(runtime,"), "{t}");
}

#[test]
fn onnx_runs_compiled_in_memory_with_the_same_results() {
    let t = run_matches_ort(&fixture("model.onnx"), "seq13", &["--compiled"]);
    assert!(t.contains("compiled in") && t.contains("(runtime,"), "{t}");
    let t = run_matches_ort(&fixture("model.onnx"), "seq13", &[]);
    assert!(t.contains("(reference executor)"), "{t}");
}

#[test]
fn random_inputs_agree_between_reference_and_artifact() {
    let dir = tmpdir("random");
    let rfa = compile_fixture(&dir, "bert.rfa");
    let args = ["--dim", "batch=2", "--dim", "seq=5", "--seed", "11"];
    let line = |model: &Path| {
        let mut a = vec!["run", model.to_str().unwrap()];
        a.extend(args);
        let o = rafter(&a);
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(out.contains("random inputs with seed 11"), "{out}");
        out.lines()
            .find(|l| l.starts_with("output "))
            .unwrap()
            .to_string()
    };
    let a = line(&rfa);
    assert!(
        a.starts_with("output last_hidden_state: f32[2, 5, 32]"),
        "{a}"
    );
    assert_eq!(a, line(&fixture("model.onnx")));
}

#[test]
fn plan_lists_kernels_buffers_weights_and_memory() {
    let dir = tmpdir("plan");
    let rfa = compile_fixture(&dir, "bert.rfa");
    for model in [rfa.clone(), fixture("model.onnx")] {
        let o = rafter(&["plan", model.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(out.starts_with("program `"), "{out}");
        assert!(
            out.lines()
                .any(|l| l.contains(" contraction on cpu: matmul")),
            "no contraction kernel listing its ops:\n{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with("  b0 `") && l.contains("input 0")),
            "{out}"
        );
        assert!(out.contains("\nweights: 37 tensors, "), "{out}");
        let last = out.lines().last().unwrap();
        let planned = last.starts_with("memory cpu: arena ")
            && last.contains(" bytes, lower bound ")
            && last.rsplit_once("ratio ").is_some_and(|(_, r)| {
                r.len() >= 4 && r.parse::<f64>().is_ok() && r.as_bytes()[r.len() - 3] == b'.'
            });
        assert!(
            last == "memory cpu: arena unplanned (sized per call)" || planned,
            "last line: {last}"
        );
    }
    let o = rafter(&["plan", rfa.to_str().unwrap()]);
    assert!(text(&o).contains("  bounds: seq<=64"), "{}", text(&o));
}

#[test]
fn devices_lists_the_cpu() {
    let o = rafter(&["devices"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("cpu: CPU device\n"), "{out}");
    for field in [
        "  cores: ",
        "  worker threads: ",
        "  memory: device_local (",
        "  isa: ",
        "  executable formats: cpu-kernels",
    ] {
        assert!(out.contains(field), "no `{field}` in:\n{out}");
    }
    #[cfg(target_arch = "x86_64")]
    {
        let isa = out.lines().find(|l| l.starts_with("  isa: ")).unwrap();
        assert_eq!(
            isa.contains(" avx2"),
            std::is_x86_feature_detected!("avx2"),
            "{isa}"
        );
    }
    let count = out.lines().last().and_then(|l| l.strip_prefix("devices: "));
    assert!(
        count
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n >= 1),
        "{out}"
    );
}

#[test]
fn devices_lists_vulkan_devices_or_says_why_there_are_none() {
    let o = rafter(&["devices"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let required = std::env::var("RAFTER_REQUIRE_VULKAN").is_ok_and(|v| !v.is_empty() && v != "0");
    if out.contains("vulkan: no devices (") {
        assert!(!required, "RAFTER_REQUIRE_VULKAN is set but:\n{out}");
        assert!(
            out.contains("no Vulkan 1.3 device found (drivers: "),
            "{out}"
        );
        return;
    }
    for field in [
        "vulkan0: Vulkan device\n",
        "  status: usable, selected",
        "  required: bufferDeviceAddress yes, timelineSemaphore yes, synchronization2 yes",
        "  storage buffer range: ",
        "  executable formats: spirv",
    ] {
        assert!(out.contains(field), "no `{field}` in:\n{out}");
    }
}

#[test]
fn trace_is_chrome_json_with_a_slice_per_dispatch() {
    let dir = tmpdir("trace");
    let rfa = compile_fixture(&dir, "bert.rfa");
    let trace = dir.join("trace.json");
    let t = run_matches_ort(&rfa, "seq7", &["--trace", trace.to_str().unwrap()]);
    assert!(t.contains("wrote trace"), "{t}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).expect("valid JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let dispatches: Vec<_> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "dispatch")
        .collect();
    assert!(!dispatches.is_empty(), "no dispatch slices");
    for d in &dispatches {
        assert!(d["name"].as_str().is_some_and(|n| !n.is_empty()), "{d}");
        assert!(
            d["ts"].as_f64().is_some() && d["dur"].as_f64().is_some(),
            "{d}"
        );
    }
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "cpu:0"),
        "no track for queue cpu:0"
    );
    // One slice per dispatch step of the program, but for views placed over their
    // operand, which are never dispatched (the fixture has some: its reshapes).
    let plan = rafter(&["plan", rfa.to_str().unwrap()]);
    let plan = String::from_utf8_lossy(&plan.stdout);
    let cpu_steps = |l: &&str| l.contains(" on cpu: ");
    let views = plan
        .lines()
        .filter(cpu_steps)
        .filter(|l| l.contains("never dispatched"))
        .count();
    let steps = plan.lines().filter(cpu_steps).count();
    assert!(views > 0, "no placed view in the fixture's plan:\n{plan}");
    assert_eq!(dispatches.len(), steps - views);
}

#[test]
fn corrupt_and_truncated_artifacts_are_named_errors() {
    let dir = tmpdir("corrupt");
    let rfa = compile_fixture(&dir, "bert.rfa");
    let mut bytes = std::fs::read(&rfa).unwrap();
    // The last bytes are weights: flip one of them.
    let n = bytes.len();
    let at = (n - 4096..n).rev().find(|&i| bytes[i] != 0).unwrap();
    bytes[at] ^= 0x40;
    let bad = dir.join("bad.rfa");
    std::fs::write(&bad, &bytes).unwrap();
    let o = rafter(&["run", bad.to_str().unwrap(), "--seed", "1"]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("invalid artifact") && t.contains("weights") && t.contains("checksum"),
        "{t}"
    );
    let short = dir.join("short.rfa");
    std::fs::write(&short, &bytes[..5000]).unwrap();
    for cmd in ["run", "plan"] {
        let o = rafter(&[cmd, short.to_str().unwrap()]);
        assert!(!o.status.success());
        assert!(
            text(&o).contains("short.rfa") && text(&o).contains("truncated"),
            "{}",
            text(&o)
        );
    }
}

#[test]
fn missing_files_and_bad_dims_are_errors() {
    for cmd in [
        &["compile", "/nonexistent/model.onnx"][..],
        &["plan", "/nonexistent/model.rfa"],
        &["run", "/nonexistent/model.rfa"],
    ] {
        let o = rafter(cmd);
        assert!(!o.status.success());
        assert!(text(&o).contains("/nonexistent/model."), "{}", text(&o));
    }
    let model = fixture("model.onnx");
    for (dim, says) in [
        ("seq<64", "expected SYMBOL=N or SYMBOL<=N"),
        ("seq<=many", "`many` is not an integer"),
        ("2seq<=4", "`2seq` is not a symbol name"),
    ] {
        let o = rafter(&["compile", model.to_str().unwrap(), "--dim", dim]);
        assert!(!o.status.success());
        assert!(text(&o).contains(says), "{dim}: {}", text(&o));
    }
    // A bound means nothing to the reference executor.
    let o = rafter(&["run", model.to_str().unwrap(), "--dim", "seq<=8"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("only means something when compiling"),
        "{}",
        text(&o)
    );
}

#[test]
fn inputs_above_the_compiled_bound_are_rejected() {
    let dir = tmpdir("bound");
    let rfa = compile_fixture(&dir, "bert.rfa");
    let o = rafter(&[
        "run",
        rfa.to_str().unwrap(),
        "--dim",
        "batch=1",
        "--dim",
        "seq=65",
        "--seed",
        "1",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("`seq` = 65, above its declared bound 64"),
        "{}",
        text(&o)
    );
}

#[test]
fn bench_ends_with_the_summary_line() {
    let dir = tmpdir("bench");
    let rfa = compile_fixture(&dir, "tiny.rfa");
    let o = rafter(&[
        "bench",
        rfa.to_str().unwrap(),
        "--dim",
        "batch=1",
        "--dim",
        "seq=9",
        "--warmup",
        "1",
        "--iters",
        "3",
        "--threads",
        "2",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let last = out.lines().last().unwrap_or_default();
    let fields: Vec<&str> = last.split(", ").collect();
    assert_eq!(fields.len(), 4, "{last}");
    assert!(
        fields[0].starts_with("bench: median ") && fields[0].ends_with(" ms"),
        "{last}"
    );
    assert!(
        fields[1].starts_with("p10 ") && fields[2].starts_with("p90 "),
        "{last}"
    );
    assert!(
        fields[3].starts_with("peak RSS ") && fields[3].ends_with(" MB"),
        "{last}"
    );
    let ms = |f: &str| -> f64 { f.split(' ').rev().nth(1).unwrap().parse().unwrap() };
    assert!(
        ms(fields[1]) <= ms(fields[0]) && ms(fields[0]) <= ms(fields[2]),
        "{last}"
    );

    let o = rafter(&["bench", rfa.to_str().unwrap(), "--iters", "0"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--iters must be at least 1"),
        "{}",
        text(&o)
    );
}

#[test]
fn rafter_cpu_isa_picks_a_kernel_set_and_reports_an_unknown_one() {
    let dir = tmpdir("isa");
    let rfa = compile_fixture(&dir, "tiny.rfa");
    let bench = |isa: &str| {
        Command::new(env!("CARGO_BIN_EXE_rafter"))
            .args([
                "bench",
                rfa.to_str().unwrap(),
                "--dim",
                "batch=1",
                "--dim",
                "seq=9",
                "--warmup",
                "0",
                "--iters",
                "1",
            ])
            .env("RAFTER_CPU_ISA", isa)
            .output()
            .expect("the rafter binary runs")
    };
    // A name no CPU runs: reported once on stderr, the detected kernels used instead.
    let o = bench("sse4");
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("RAFTER_CPU_ISA=sse4 is not a kernel set")
            .count(),
        1,
        "{err}"
    );
    // The portable kernels run everywhere: taken without a word.
    let o = bench("scalar");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("RAFTER_CPU_ISA"),
        "{}",
        text(&o)
    );
}

#[test]
fn sixteen_bit_weights_shrink_the_artifact_and_stay_close_to_onnx_runtime() {
    let dir = tmpdir("cpu-weights");
    let f32_len = std::fs::metadata(compile_fixture(&dir, "f32.rfa"))
        .unwrap()
        .len();
    for (format, tol) in [("bf16", 3e-2f64), ("f16", 4e-3)] {
        let flags = ["--cpu-weights", format];
        let rfa = compile_fixture_with(&dir, &format!("{format}.rfa"), &flags);
        let len = std::fs::metadata(&rfa).unwrap().len();
        assert!(len < f32_len, "{format}: {len} bytes vs f32's {f32_len}");
        // The weights are rounded to 8 (bf16) or 11 (f16) significant bits: close to ONNX
        // Runtime's f32 result, and not equal to it (the rounding is real).
        let (diff, _) = run_against_ort(&rfa, "seq13", &[]);
        assert!(diff < tol && diff > 1e-6, "{format}: max abs diff {diff}");
    }

    // Bad values are errors that say what is accepted.
    let model = fixture("model.onnx");
    let out = dir.join("x.rfa");
    let compile = |extra: &[&str]| {
        let mut args = vec![
            "compile",
            model.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        let o = rafter(&args);
        assert!(!o.status.success(), "{extra:?} was accepted");
        text(&o)
    };
    let t = compile(&["--cpu-weights", "f8"]);
    assert!(t.contains("expected f32, f16 or bf16"), "{t}");
    let t = compile(&["--cpu-weights", "bf16", "--target", "vulkan"]);
    assert!(t.contains("--target cpu only"), "{t}");
}

/// The `rafter ...` lines of README.md's usage sections (up to its LLM section), in order.
fn readme_commands() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let start = readme
        .find("## Using it")
        .expect("README has `## Using it`");
    let end = readme.find("### LLMs").expect("README has `### LLMs`");
    let mut in_block = false;
    let mut out = Vec::new();
    for line in readme[start..end].lines() {
        if line.starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block && line.starts_with("rafter ") {
            // Comments are set off by two or more spaces and `#`.
            let cmd = line.find("  #").map_or(line, |i| &line[..i]);
            out.push(cmd.trim().to_string());
        }
    }
    out
}

/// Every README example runs as written, with `model.onnx` the demo encoder and `ids.npy`
/// an int64 [1, 8] array of token ids (as the README says). The Vulkan ones run where a Vulkan device
/// is (CI: lavapipe), the conformance ones where the suite's data is.
#[test]
fn readme_examples_run_as_written() {
    let dir = tmpdir("readme");
    std::fs::copy(fixture("model.onnx"), dir.join("model.onnx")).unwrap();
    let ids: Vec<i64> = (1..9).collect();
    write_npy(&dir.join("ids.npy"), &Tensor::i64s(&[1, 8], ids)).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_rafter")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let vulkan = text(&rafter(&["devices"])).contains("\nvulkan")
        || std::env::var("RAFTER_REQUIRE_VULKAN").as_deref() == Ok("1");
    let conformance = std::env::var_os("RAFTER_CONFORMANCE_DIR").is_some();
    let commands = readme_commands();
    assert!(commands.len() >= 15, "README examples: {commands:?}");
    for cmd in commands {
        if (cmd.contains("vulkan") && cmd.contains("run") && !vulkan)
            || (cmd.contains("--device vulkan") && !vulkan)
            || (cmd.contains("conformance") && !conformance)
        {
            eprintln!("skipped here (no Vulkan device or conformance data): {cmd}");
            continue;
        }
        let o = Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .current_dir(&dir)
            .env("PATH", &path)
            .env("RAFTER_PIPELINE_CACHE", "")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "README example `{cmd}` failed:\n{}",
            text(&o)
        );
    }
}

/// A bound or a value the demo model cannot reach (its position table has 64 rows) is an
/// error naming the node that limits it, at compile time with the largest value that works.
#[test]
fn unreachable_dims_name_the_limiting_node() {
    let dir = tmpdir("unreachable");
    let model = fixture("model.onnx");
    let out = dir.join("m.rfa");
    let o = rafter(&[
        "compile",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--dim",
        "seq<=2048",
    ]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("only holds together up to seq = 64") && t.contains("/embeddings/Slice"),
        "{t}"
    );
    let o = rafter(&["run", "--dim", "seq=128"]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("does not hold together at batch=1, seq=128") && t.contains("/embeddings/Slice"),
        "{t}"
    );
    let o = rafter(&["run", "--dim", "foo=3"]);
    assert!(text(&o).contains("the model has no symbol `foo` (its symbols: batch, seq)"));
}

/// An unknown `--kv-type`, and one given to a model that is not an LLM, are errors that name
/// the flag.
#[test]
fn kv_type_errors_name_the_flag() {
    let out = rafter(&["generate", "model.gguf", "--kv-type", "f8", "-p", "hi"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kv-type f8: expected f16 or f32"), "{err}");

    let dir = tmpdir("kv-type");
    let out = rafter(&[
        "compile",
        fixture("model.onnx").to_str().unwrap(),
        "-o",
        dir.join("m.rfa").to_str().unwrap(),
        "--kv-type",
        "f16",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kv-type applies to LLMs"), "{err}");
}

#[test]
fn matmul_precision_errors_name_the_flag_and_the_choices() {
    for cmd in ["generate", "serve"] {
        let out = rafter(&[cmd, "model.gguf", "--matmul-precision", "fp8"]);
        assert!(!out.status.success(), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--matmul-precision")
                && err.contains("unknown matmul precision `fp8` (expected f32 or bf16)"),
            "{cmd}: {err}"
        );
    }
}

/// `bench --device auto --objective throughput --in-flight N` spreads whole calls over the
/// CPU and the Vulkan device (lavapipe here): every call's outputs are checked inside
/// against the CPU run (the bench fails otherwise), each device reports its calls and idle.
#[test]
fn throughput_stream_spreads_calls_over_cpu_and_vulkan() {
    if !text(&rafter(&["devices"])).contains("\nvulkan")
        && std::env::var("RAFTER_REQUIRE_VULKAN").as_deref() != Ok("1")
    {
        eprintln!("no Vulkan device: the spread stream needs two devices");
        return;
    }
    let model = fixture("model.onnx");
    let o = rafter(&[
        "bench",
        model.to_str().unwrap(),
        "--device",
        "auto",
        "--objective",
        "throughput",
        "--in-flight",
        "3",
        "--dim",
        "batch=1",
        "--dim",
        "seq=9",
        "--warmup",
        "1",
        "--iters",
        "24",
        "--threads",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("spread: 24 calls, 3 in flight per device, "),
        "{out}"
    );
    // A trial first measures the spread against the fastest device alone; the stream
    // runs on what it chose.
    let trial = out
        .lines()
        .find(|l| l.starts_with("spread trial: "))
        .unwrap_or_else(|| panic!("no trial line: {out}"));
    let spread = trial.ends_with(": spread");
    assert!(spread || trial.ends_with(" alone"), "{trial}");
    let calls = |device: &str| -> Option<usize> {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("spread device {device}: ")))?;
        Some(line.split(' ').nth(3).unwrap().parse().unwrap())
    };
    let (cpu, vulkan) = (calls("cpu"), calls("vulkan"));
    if spread {
        assert!(cpu.is_some() && vulkan.is_some(), "{out}");
    } else {
        assert!(cpu.is_some() != vulkan.is_some(), "one device alone: {out}");
    }
    assert_eq!(cpu.unwrap_or(0) + vulkan.unwrap_or(0), 24, "{out}");
}
