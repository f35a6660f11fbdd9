//! End-to-end tests of the `rafter` binary: the BERT-like fixture against ONNX Runtime's
//! saved outputs at two sequence lengths from one import, and the run-time input errors.

use rafter_reference::npy::{read_npy, write_npy};
use rafter_reference::Tensor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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
