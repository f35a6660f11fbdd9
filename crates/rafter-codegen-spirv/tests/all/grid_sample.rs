//! Grid sampling (`grid_sample`) on the Vulkan device (lavapipe in CI), against the
//! reference executor: 4-D (images) and 5-D (volumes); linear, nearest and cubic modes;
//! zeros, border and reflection padding (grid points up to 1.5 past the edges, so every
//! padding rule is taken); aligned corners or not; f32 and f16 data and grids. Every
//! module passes spirv-val.

use crate::common;

use rafter_codegen_spirv::{grid_sample, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;

/// Samples `x` (dims `x`) at a grid of `points` per image; `attrs` the IR's attributes.
fn run(
    device: &rafter_hal_vulkan::VulkanDevice,
    (x_dims, points): (&[usize], &[usize]),
    (dtype, grid_dtype): (DType, DType),
    attrs: &str,
) {
    let r = x_dims.len() - 2;
    let g_dims: Vec<usize> = [vec![x_dims[0]], points.to_vec(), vec![r]].concat();
    let y_dims: Vec<usize> = [vec![x_dims[0], x_dims[1]], points.to_vec()].concat();
    let text = format!(
        "graph @g(%x: {dtype}[{}], %grid: {grid_dtype}[{}]) -> (%y) {{\n  %y: {dtype}[{}] = grid_sample{{{attrs}}}(%x, %grid)\n}}",
        common::dims_text(x_dims),
        common::dims_text(&g_dims),
        common::dims_text(&y_dims),
    );
    let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let count = |d: &[usize]| d.iter().product::<usize>();
    let xv: Vec<f32> = (0..count(x_dims))
        .map(|i| ((i * 37) % 23) as f32 * 0.25 - 2.5)
        .collect();
    // Points in [-1.5, 1.5] in steps of 1/32 (exact in f16 too), the corners among them.
    let gv: Vec<f32> = (0..count(&g_dims))
        .map(|i| ((i * 29 + 7) % 97) as f32 / 32.0 - 1.5)
        .collect();
    let inputs = vec![
        common::floats(dtype, x_dims, &xv),
        common::floats(grid_dtype, &g_dims, &gv),
    ];
    let want = rafter_reference::run(&body, inputs.clone())
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .remove(0);
    assert_eq!(want.shape(), y_dims, "{text}");
    let kernel = grid_sample(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "grid_sample");
    let module = kernel_module(&body, 0).unwrap();
    let got = common::run_module(device, &module, &inputs, (dtype, &y_dims));
    let rtol = if dtype == DType::F16 { 2e-3 } else { 1e-5 };
    for (k, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!(
            common::close(*g as f32, w as f32, 1e-4, rtol),
            "{text}: element {k}: {g} vs reference {w}"
        );
    }
}

const MODES: [&str; 3] = ["linear", "nearest", "cubic"];
const PADDINGS: [&str; 3] = ["zeros", "border", "reflection"];

#[test]
fn grid_sample_4d_matches_the_reference() {
    let Some(device) = common::device_or_skip("grid_sample") else {
        return;
    };
    let shapes = ([2usize, 3, 4, 5].as_slice(), [3usize, 4].as_slice());
    for mode in MODES {
        for padding in PADDINGS {
            for align in [false, true] {
                let attrs =
                    format!("mode = {mode}, padding_mode = {padding}, align_corners = {align}");
                run(&device, shapes, (DType::F32, DType::F32), &attrs);
            }
        }
    }
    // f16 data and grid, and f16 data by an f32 grid.
    let attrs = "mode = cubic, padding_mode = reflection, align_corners = false";
    run(&device, shapes, (DType::F16, DType::F16), attrs);
    let attrs = "mode = linear, padding_mode = border, align_corners = true";
    run(&device, shapes, (DType::F16, DType::F32), attrs);
    // A one-pixel-wide input: reflection's range is empty along that dim.
    let attrs = "mode = linear, padding_mode = reflection, align_corners = true";
    run(
        &device,
        ([1, 2, 1, 4].as_slice(), [2, 3].as_slice()),
        (DType::F32, DType::F32),
        attrs,
    );
}

#[test]
fn grid_sample_5d_matches_the_reference() {
    let Some(device) = common::device_or_skip("grid_sample") else {
        return;
    };
    let shapes = ([2usize, 2, 3, 4, 3].as_slice(), [2usize, 3, 2].as_slice());
    for mode in MODES {
        for padding in PADDINGS {
            for align in [false, true] {
                let attrs =
                    format!("mode = {mode}, padding_mode = {padding}, align_corners = {align}");
                run(&device, shapes, (DType::F32, DType::F32), &attrs);
            }
        }
    }
}

/// What the kernel does not take is refused with a reason, never a panic.
#[test]
fn grid_sample_refusals_name_the_reason() {
    let text = "graph @g(%x: f32[1, 2, h, 4], %grid: f32[1, 3, 3, 2]) -> (%y) {\n  %y: f32[1, 2, 3, 3] = grid_sample{mode = linear, padding_mode = zeros, align_corners = false}(%x, %grid)\n}";
    let body = parse_graph(text).unwrap();
    assert!(grid_sample(&body).unwrap_err().contains("not static"));
    let text = "graph @g(%x: i32[1, 2, 3, 4], %grid: f32[1, 3, 3, 2]) -> (%y) {\n  %y: i32[1, 2, 3, 3] = grid_sample{mode = linear, padding_mode = zeros, align_corners = false}(%x, %grid)\n}";
    let body = parse_graph(text).unwrap();
    assert!(grid_sample(&body).unwrap_err().contains("only f32 and f16"));
}
