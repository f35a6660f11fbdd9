//! The deploy-only runtime end to end: artifacts compiled here (`rafter-compiler`, a test
//! dependency only), run by the `rafter-deploy` binary and library, outputs checked
//! against the reference executor.

use std::path::{Path, PathBuf};
use std::process::Command;

use rafter_deploy::{read_npy, write_npy, Options, Tensor};
use rafter_ir::text::parse_graph;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rafter-deploy-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles `text` for the CPU into `dir/model.rfa`.
fn artifact(text: &str, dir: &Path) -> (rafter_ir::Graph, PathBuf) {
    let g = parse_graph(text).unwrap();
    let path = dir.join("model.rfa");
    rafter_compiler::compile(&g, &Default::default())
        .unwrap()
        .write(&path)
        .unwrap();
    (g, path)
}

/// A small convolutional block every kernel of which runs natively on the CPU.
const CONV_NET: &str = "graph @net(%x: f32[1, 3, 8, 8]) -> (%y) {
  const %w: f32[4, 3, 3, 3] = dense [0.1, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0, -0.3, 0.1, 0.2, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0, -0.3, 0.1, 0.2, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0, -0.3, 0.1, 0.2, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0, -0.3, 0.1, 0.2, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0, -0.3, 0.1, 0.2, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0, -0.3, 0.1, 0.2, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0, -0.3, 0.1, 0.2, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0, -0.3, 0.1, 0.2, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0, -0.3, 0.1, 0.2, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0, -0.3, 0.1, 0.2, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.0]
  %c: f32[1, 4, 8, 8] = conv{kernel_shape = [3, 3], strides = [1, 1], pads = [1, 1, 1, 1], dilations = [1, 1], group = 1, auto_pad = explicit}(%x, %w)
  %r: f32[1, 4, 8, 8] = unary{op = relu}(%c)
  %y: f32[1, 4, 1, 1] = global_pool{kind = max, p = 0}(%r)
}";

fn input() -> Tensor {
    let x: Vec<f32> = (0..192)
        .map(|i| ((i * 37) % 17) as f32 / 8.0 - 1.0)
        .collect();
    Tensor::f32s(&[1, 3, 8, 8], x)
}

fn reference(g: &rafter_ir::Graph, x: &Tensor) -> Vec<f64> {
    let x = rafter_reference::Tensor::from_le_bytes(x.dtype(), x.shape(), x.le_bytes()).unwrap();
    rafter_reference::run(g, vec![x]).unwrap()[0].to_f64_vec()
}

#[test]
fn the_binary_runs_an_artifact_and_writes_its_outputs() {
    let dir = temp_dir("binary");
    let (g, model) = artifact(CONV_NET, &dir);
    let x = input();
    write_npy(&dir.join("x.npy"), &x).unwrap();
    let out = dir.join("out");
    let run = Command::new(env!("CARGO_BIN_EXE_rafter-deploy"))
        .arg(&model)
        .args(["--input", &format!("x={}", dir.join("x.npy").display())])
        .args(["--output-dir", &out.display().to_string(), "--iters", "3"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("output y: f32[1, 4, 1, 1]"), "{stdout}");
    assert!(stdout.contains("ran 3 call(s): median"), "{stdout}");
    let got = read_npy(&out.join("y.npy")).unwrap().to_f64_vec();
    let want = reference(&g, &x);
    for (a, b) in got.iter().zip(&want) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{got:?} vs {want:?}"
        );
    }
    // A missing input is named, with the flag that gives it.
    let run = Command::new(env!("CARGO_BIN_EXE_rafter-deploy"))
        .arg(&model)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("input `x` (f32[1, 3, 8, 8]) is not given: pass --input x=FILE.npy"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_library_opens_and_runs_an_artifact() {
    let dir = temp_dir("library");
    let (g, model) = artifact(CONV_NET, &dir);
    let session = rafter_deploy::open(&model, &Options { threads: 2 }).unwrap();
    let x = input();
    let got = session
        .run(vec![x.clone()], std::time::Duration::from_secs(60))
        .unwrap();
    assert_eq!(got[0].to_f64_vec().len(), 4);
    let want = reference(&g, &x);
    for (a, b) in got[0].to_f64_vec().iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()));
    }
    assert_eq!(session.native_stats().fallbacks, 0);
    let e = rafter_deploy::open(dir.join("missing.rfa"), &Options::default()).unwrap_err();
    assert!(e.to_string().contains("missing.rfa"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A kernel no native CPU kernel covers (a `range`) runs only with the interpreter; a
/// deploy-only build without it refuses the artifact when it opens it, naming the kernel.
#[test]
fn an_uncovered_kernel_needs_the_interpreter() {
    let dir = temp_dir("uncovered");
    let (_, model) = artifact(
        "graph @r(%n: i64[]) -> (%y) {
  const %zero: i64[] = dense [0]
  const %one: i64[] = dense [1]
  %y: i64[_range0] = range(%zero, %n, %one)
}",
        &dir,
    );
    let opened = rafter_deploy::open(&model, &Options::default());
    if rafter_runtime_cpu::INTERPRETER {
        let s = opened.unwrap();
        let y = s
            .run(
                vec![Tensor::i64s(&[], vec![4])],
                std::time::Duration::from_secs(60),
            )
            .unwrap();
        assert_eq!(y[0].as_slice::<i64>().unwrap(), &[0, 1, 2, 3]);
    } else {
        let e = opened.unwrap_err().to_string();
        assert!(
            e.contains("`k0_range` (range) has no native CPU kernel"),
            "{e}"
        );
        assert!(e.contains("no interpreter"), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
