//! Inference never panics: every op against malformed and extreme operands.

use super::*;
use crate::*;
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

fn sub_graph(ins: usize, outs: usize) -> Box<Graph> {
    let mut g = Graph::new("body");
    for i in 0..ins {
        g.add_input(format!("i{i}"), ty(DType::F32, &["k", "2"]));
    }
    for i in 0..outs {
        let v = g.add_input(format!("o{i}"), ty(DType::F32, &["k", "2"]));
        g.inputs.pop();
        g.outputs.push(v);
    }
    Box::new(g)
}

/// At least one instance of every op, with ordinary and odd attributes.
fn all_ops() -> Vec<Op> {
    let conv = |auto_pad, strides: Vec<i64>| Op::Conv {
        kernel_shape: vec![],
        strides,
        pads: vec![],
        dilations: vec![],
        group: 1,
        auto_pad,
    };
    let pool = |ceil_mode, kernel: Vec<i64>| Op::Pool {
        kind: PoolKind::Max,
        kernel_shape: kernel,
        strides: vec![2, 2],
        pads: vec![1, 1, 1, 1],
        dilations: vec![],
        auto_pad: AutoPad::NotSet,
        ceil_mode,
        count_include_pad: false,
        p: 2,
        storage_order: 0,
    };
    let resize = |axes| Op::Resize {
        mode: ResizeMode::Linear,
        coordinate_transformation_mode: CoordTransform::HalfPixel,
        nearest_mode: NearestMode::Floor,
        cubic_coeff_a: -0.75,
        exclude_outside: false,
        extrapolation_value: 0.0,
        antialias: false,
        axes,
        keep_aspect_ratio_policy: AspectPolicy::NotSmaller,
    };
    vec![
        Op::Identity,
        Op::Unary { op: UnaryOp::Neg },
        Op::Unary { op: UnaryOp::IsNaN },
        Op::Binary { op: BinaryOp::Add },
        Op::Binary { op: BinaryOp::Div },
        Op::Binary { op: BinaryOp::Mod },
        Op::Binary { op: BinaryOp::Pow },
        Op::Binary {
            op: BinaryOp::ShiftLeft,
        },
        Op::Binary {
            op: BinaryOp::PRelu,
        },
        Op::Binary { op: BinaryOp::Mul },
        Op::Where,
        Op::Clip,
        Op::Cast { to: DType::U8 },
        Op::Cast { to: DType::Bool },
        Op::LeakyRelu { alpha: 0.1 },
        Op::Elu { alpha: 1.0 },
        Op::Selu {
            alpha: 1.0,
            gamma: 1.0,
        },
        Op::Celu { alpha: 1.0 },
        Op::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
        Op::ThresholdedRelu { alpha: 1.0 },
        Op::Shrink {
            bias: 0.0,
            lambd: 0.5,
        },
        Op::Gelu {
            approximate: GeluApprox::None,
        },
        Op::IsInf {
            detect_negative: true,
            detect_positive: false,
        },
        Op::Reduce {
            kind: ReduceKind::Prod,
            axes: vec![],
            keep_dims: true,
            noop_with_empty_axes: false,
        },
        Op::Reduce {
            kind: ReduceKind::Max,
            axes: vec![i64::MIN, i64::MAX],
            keep_dims: false,
            noop_with_empty_axes: false,
        },
        Op::ArgReduce {
            kind: ArgKind::Min,
            axis: -1,
            keep_dims: false,
            select_last_index: true,
        },
        Op::Cumulative {
            kind: CumKind::Prod,
            exclusive: true,
            reverse: true,
        },
        Op::Softmax {
            kind: SoftmaxKind::Hardmax,
            axis: i64::MIN,
        },
        Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
        },
        Op::RmsNorm {
            axis: 1,
            epsilon: 1e-5,
        },
        Op::GroupNorm {
            num_groups: 0,
            epsilon: 1e-5,
        },
        Op::GroupNorm {
            num_groups: 2,
            epsilon: 1e-5,
        },
        Op::InstanceNorm { epsilon: 1e-5 },
        Op::BatchNorm { epsilon: 1e-5 },
        Op::LpNorm { axis: 0, p: 2 },
        Op::Lrn {
            alpha: 1.0,
            beta: 1.0,
            bias: 1.0,
            size: 0,
        },
        Op::MeanVarianceNorm {
            axes: vec![0, 2, 3],
        },
        Op::MatMul,
        Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: true,
            trans_b: false,
        },
        conv(AutoPad::NotSet, vec![]),
        conv(AutoPad::SameUpper, vec![i64::MAX, 3]),
        conv(AutoPad::Valid, vec![2, 2]),
        Op::Conv {
            kernel_shape: vec![i64::MAX, 2],
            strides: vec![1, 1],
            pads: vec![i64::MAX, i64::MIN, 0, 0],
            dilations: vec![i64::MAX, 1],
            group: i64::MAX,
            auto_pad: AutoPad::NotSet,
        },
        Op::ConvTranspose {
            kernel_shape: vec![],
            strides: vec![i64::MAX, 2],
            pads: vec![],
            dilations: vec![],
            group: 2,
            auto_pad: AutoPad::NotSet,
            output_padding: vec![i64::MIN, 1],
            output_shape: vec![],
        },
        Op::ConvTranspose {
            kernel_shape: vec![3, 3],
            strides: vec![],
            pads: vec![],
            dilations: vec![],
            group: 1,
            auto_pad: AutoPad::SameLower,
            output_padding: vec![],
            output_shape: vec![-5, 7],
        },
        Op::Einsum {
            equation: "...ij,...jk->...ik".into(),
        },
        Op::Einsum {
            equation: "ab...,b...->".into(),
        },
        Op::Einsum {
            equation: ".....".into(),
        },
        Op::MatMulInteger,
        Op::MatMulBlockQuant {
            k: 3,
            n: 2,
            bits: 4,
            block_size: 16,
            accuracy_level: 0,
        },
        Op::MatMulBlockQuant {
            k: i64::MAX,
            n: i64::MAX,
            bits: 8,
            block_size: 1,
            accuracy_level: 4,
        },
        Op::ConvNhwc {
            kernel_shape: vec![3, 3],
            strides: vec![2, 2],
            pads: vec![1, 1, 1, 1],
            dilations: vec![],
            group: 1,
            auto_pad: AutoPad::NotSet,
        },
        Op::ConvInteger {
            kernel_shape: vec![],
            strides: vec![],
            pads: vec![],
            dilations: vec![],
            group: 1,
            auto_pad: AutoPad::NotSet,
        },
        Op::QuantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype: DType::I8,
        },
        Op::DequantizeLinear {
            axis: 1,
            block_size: 0,
        },
        Op::DynamicQuantizeLinear,
        Op::Attention {
            is_causal: false,
            kv_num_heads: 2,
            q_num_heads: 4,
            qk_matmul_output_mode: 0,
            scale: None,
            softcap: 0.0,
            left_window_size: -1,
            right_window_size: -1,
        },
        Op::Attention {
            is_causal: false,
            kv_num_heads: i64::MIN,
            q_num_heads: i64::MAX,
            qk_matmul_output_mode: 3,
            scale: Some(1.0),
            softcap: 1.0,
            left_window_size: i64::MAX,
            right_window_size: i64::MIN,
        },
        Op::RotaryEmbedding {
            interleaved: true,
            num_heads: 2,
            rotary_embedding_dim: 0,
        },
        pool(false, vec![2, 2]),
        pool(true, vec![2, 2]),
        pool(true, vec![i64::MAX, 0]),
        Op::GlobalPool {
            kind: PoolKind::Lp,
            p: 3,
        },
        Op::MaxUnpool {
            kernel_shape: vec![2, 2],
            strides: vec![],
            pads: vec![],
        },
        Op::MaxUnpool {
            kernel_shape: vec![i64::MIN, 2],
            strides: vec![i64::MAX, 1],
            pads: vec![],
        },
        Op::Reshape { allow_zero: false },
        Op::Reshape { allow_zero: true },
        Op::Shape {
            start: i64::MIN,
            end: Some(i64::MAX),
        },
        Op::Shape {
            start: -1,
            end: None,
        },
        Op::Size,
        Op::Transpose { perm: vec![] },
        Op::Transpose { perm: vec![1, 0] },
        Op::Squeeze { axes: vec![] },
        Op::Squeeze { axes: vec![0] },
        Op::Unsqueeze { axes: vec![0, -1] },
        Op::Unsqueeze {
            axes: vec![i64::MIN],
        },
        Op::Flatten { axis: i64::MIN },
        Op::Flatten { axis: 1 },
        Op::Concat { axis: 0 },
        Op::Concat { axis: -1 },
        Op::Split { axis: 0 },
        Op::Slice,
        Op::Gather { axis: 0 },
        Op::Gather { axis: -1 },
        Op::GatherElements { axis: 1 },
        Op::GatherNd { batch_dims: 0 },
        Op::GatherNd {
            batch_dims: i64::MAX,
        },
        Op::ScatterElements {
            axis: 0,
            reduction: ScatterReduction::Add,
        },
        Op::ScatterNd {
            reduction: ScatterReduction::None,
        },
        Op::Expand,
        Op::Tile,
        Op::Pad {
            mode: PadMode::Reflect,
        },
        Op::ConstantOfShape {
            value: Scalar::Int(DType::I64, 7),
        },
        Op::ConstantOfShape {
            value: Scalar::UInt(DType::U64, u64::MAX),
        },
        Op::ConstantOfShape {
            value: Scalar::Bool(true),
        },
        Op::Range,
        Op::OneHot { axis: -1 },
        Op::OneHot { axis: i64::MIN },
        Op::Trilu { upper: false },
        Op::TopK {
            axis: -1,
            largest: true,
            sorted: true,
        },
        Op::NonZero,
        Op::Compress { axis: None },
        Op::Compress { axis: Some(1) },
        Op::Unique {
            axis: None,
            sorted: true,
        },
        Op::Unique {
            axis: Some(i64::MAX),
            sorted: false,
        },
        Op::ReverseSequence {
            batch_axis: 1,
            time_axis: 0,
        },
        Op::DepthToSpace {
            blocksize: 2,
            mode: DepthToSpaceMode::Crd,
        },
        Op::DepthToSpace {
            blocksize: i64::MAX,
            mode: DepthToSpaceMode::Dcr,
        },
        Op::SpaceToDepth {
            blocksize: i64::MIN,
        },
        Op::SpaceToDepth { blocksize: 2 },
        Op::EyeLike {
            dtype: DType::F32,
            k: 0,
        },
        resize(vec![]),
        resize(vec![2, 3]),
        Op::GridSample {
            mode: GridSampleMode::Cubic,
            padding_mode: GridPadding::Border,
            align_corners: true,
        },
        Op::NonMaxSuppression {
            center_point_box: 1,
        },
        Op::Dft {
            axis: Some(1),
            inverse: false,
            onesided: true,
        },
        Op::Dft {
            axis: None,
            inverse: true,
            onesided: true,
        },
        Op::Dft {
            axis: Some(i64::MIN),
            inverse: true,
            onesided: false,
        },
        Op::Stft { onesided: true },
        Op::Stft { onesided: false },
        Op::Window {
            kind: WindowKind::Hann,
            periodic: true,
            dtype: DType::F32,
        },
        Op::Window {
            kind: WindowKind::Blackman,
            periodic: false,
            dtype: DType::Bool,
        },
        Op::MelWeightMatrix { dtype: DType::F16 },
        Op::RoiAlign {
            mode: RoiPoolMode::Avg,
            half_pixel: true,
            output_height: 2,
            output_width: 3,
            sampling_ratio: 0,
            spatial_scale: 0.5,
        },
        Op::RoiAlign {
            mode: RoiPoolMode::Max,
            half_pixel: false,
            output_height: i64::MIN,
            output_width: i64::MAX,
            sampling_ratio: -1,
            spatial_scale: f32::NAN,
        },
        Op::DeformConv {
            kernel_shape: vec![],
            strides: vec![],
            pads: vec![],
            dilations: vec![],
            group: 1,
            offset_group: 1,
        },
        Op::DeformConv {
            kernel_shape: vec![3, 3],
            strides: vec![2, 2],
            pads: vec![1, 1, 1, 1],
            dilations: vec![i64::MAX, 1],
            group: i64::MIN,
            offset_group: i64::MAX,
        },
        Op::QLinearMatMul,
        Op::QLinearConv {
            kernel_shape: vec![],
            strides: vec![],
            pads: vec![],
            dilations: vec![],
            group: 1,
            auto_pad: AutoPad::SameUpper,
        },
        Op::LinearAttention {
            q_num_heads: 4,
            kv_num_heads: 2,
            scale: None,
            update_rule: LinearAttnRule::GatedDelta,
        },
        Op::LinearAttention {
            q_num_heads: i64::MAX,
            kv_num_heads: i64::MIN,
            scale: Some(0.5),
            update_rule: LinearAttnRule::Linear,
        },
        Op::CausalConvWithState { silu: true },
        Op::BitCast { to: DType::I32 },
        Op::BitCast { to: DType::Bool },
        Op::NllLoss {
            reduction: LossReduction::Mean,
            ignore_index: Some(-1),
        },
        Op::SoftmaxCrossEntropy {
            reduction: LossReduction::None,
            ignore_index: None,
        },
        Op::SwiGlu { alpha: 0.5 },
        Op::Linear {
            format: WeightFormat::F32,
        },
        Op::Linear {
            format: WeightFormat::Q4K,
        },
        Op::Embedding {
            format: WeightFormat::F16,
        },
        Op::Embedding {
            format: WeightFormat::Q8_0,
        },
        Op::MoeFfn {
            top_k: 2,
            normalize: true,
            activation: FfnActivation::Silu,
            gate_format: WeightFormat::F32,
            up_format: WeightFormat::F32,
            down_format: WeightFormat::F32,
        },
        Op::Det,
        Op::CenterCropPad { axes: vec![] },
        Op::CenterCropPad {
            axes: vec![-1, i64::MAX],
        },
        Op::Col2Im {
            dilations: vec![],
            pads: vec![],
            strides: vec![],
        },
        Op::Col2Im {
            dilations: vec![1, 0],
            pads: vec![i64::MAX, 0, i64::MIN, 1],
            strides: vec![2, 2],
        },
        Op::AffineGrid {
            align_corners: true,
        },
        Op::TensorScatter {
            axis: -2,
            mode: TensorScatterMode::Circular,
        },
        Op::TensorScatter {
            axis: i64::MIN,
            mode: TensorScatterMode::Linear,
        },
        Op::Binarizer { threshold: 0.5 },
        Op::ArrayFeatureExtractor,
        Op::LabelEncoder {
            int_keys: vec![1, 2],
            float_keys: vec![],
            int_values: vec![],
            float_values: vec![0.5, 1.5],
            default: Scalar::Float(DType::F32, -0.0),
        },
        Op::Lstm {
            direction: RnnDirection::Forward,
            hidden_size: 0,
            layout: 0,
            input_forget: false,
            clip: None,
            activations: vec![],
            activation_alpha: vec![],
            activation_beta: vec![],
        },
        Op::Gru {
            direction: RnnDirection::Bidirectional,
            hidden_size: 4,
            layout: 1,
            linear_before_reset: true,
            clip: Some(1.0),
            activations: vec![],
            activation_alpha: vec![],
            activation_beta: vec![],
        },
        Op::Rnn {
            direction: RnnDirection::Reverse,
            hidden_size: -3,
            layout: 0,
            clip: None,
            activations: vec![],
            activation_alpha: vec![],
            activation_beta: vec![],
        },
        Op::If {
            then_branch: sub_graph(1, 1),
            else_branch: sub_graph(1, 2),
        },
        Op::If {
            then_branch: sub_graph(0, 1),
            else_branch: sub_graph(0, 1),
        },
        Op::Loop {
            body: sub_graph(3, 2),
        },
        Op::Loop {
            body: sub_graph(0, 0),
        },
        Op::Scan {
            body: sub_graph(2, 2),
            num_scan_inputs: 1,
            num_captures: 0,
            scan_input_axes: vec![i64::MIN],
            scan_input_directions: vec![],
            scan_output_axes: vec![i64::MAX],
            scan_output_directions: vec![],
        },
        Op::Scan {
            body: sub_graph(1, 1),
            num_scan_inputs: i64::MAX,
            num_captures: i64::MIN,
            scan_input_axes: vec![],
            scan_input_directions: vec![],
            scan_output_axes: vec![],
            scan_output_directions: vec![],
        },
    ]
}

/// Operands: ordinary, empty, symbolic, huge, negative, malformed constants.
fn pool_of_inputs() -> Vec<In> {
    let mut v = vec![
        In::f32(&[]),
        In::f32(&["3"]),
        In::f32(&["0"]),
        In::f32(&["b", "s", "8"]),
        In::f32(&["1", "4", "8", "8"]),
        In::f32(&["n", "c", "h", "w"]),
        In::f32(&["2*s-1", "0", "1"]),
        In::t(DType::F16, &["2", "3"]),
        In::t(DType::U8, &["3", "68"]),
        In::t(DType::U8, &["2", "3", "144"]),
        In::t(DType::U8, &["s", "x"]),
        In::t(DType::Bool, &["3"]),
        In::t(DType::Bool, &[]),
        In::t(DType::I64, &["k"]),
        In::t(DType::I64, &["4"]),
        In::ints(&[]),
        In::ints(&[0]),
        In::ints(&[-1]),
        In::ints(&[1, -1]),
        In::ints(&[i64::MAX]),
        In::ints(&[i64::MIN]),
        In::ints(&[i64::MAX, i64::MIN, 0, -1]),
        In::ints(&[2, 3, 0, 4]),
        In::ints(&[1 << 40, 1 << 40, 1 << 40]),
        In::scalar(0),
        In::scalar(-1),
        In::scalar(i64::MIN),
        In::scalar(i64::MAX),
        In::syms(&["s", "s+1"]),
        In::syms(&["b*s", "-1", "0"]),
        In::sym_scalar("s-5"),
        In::floats(&[]),
        In::floats(&[f32::NAN, f32::INFINITY, -1.0, 1e30]),
        In::floats(&[2.0, 2.0, 2.0, 2.0]),
        In::fscalar(f32::NAN),
        In::fscalar(-0.5),
        In::f32(&[&i64::MAX.to_string(), "2"]),
        In::f32(&["4611686018427387904*s"]),
    ];
    // Constants whose bytes do not match their shape, and syms of the wrong length.
    let mut bad = In::ints(&[1, 2, 3]);
    bad.konst.as_mut().unwrap().dims = vec![100];
    bad.sym = None;
    v.push(bad);
    let mut bad = In::ints(&[1, 2, 3]);
    bad.sym = Some(dims(&["1"]));
    v.push(bad);
    let mut bad = In::floats(&[1.0, 2.0]);
    bad.konst.as_mut().unwrap().dims = vec![usize::MAX, 2];
    v.push(bad);
    v
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

#[test]
fn every_op_is_listed() {
    let listed: BTreeSet<&str> = all_ops().iter().map(Op::name).collect();
    let all: BTreeSet<&str> = Op::NAMES.iter().copied().collect();
    assert_eq!(listed, all);
}

#[test]
fn never_panics() {
    let ops = all_ops();
    let pool = pool_of_inputs();
    let mut rng = Lcg(42);
    let mut ok = 0usize;
    for op in &ops {
        for _ in 0..400 {
            let n = rng.next(7);
            let ins: Vec<Option<&In>> = (0..n)
                .map(|_| (rng.next(8) != 0).then(|| &pool[rng.next(pool.len())]))
                .collect();
            let outs = rng.next(5);
            let r = catch_unwind(AssertUnwindSafe(|| run(op, &ins, outs)));
            match r {
                Ok(Ok(res)) => {
                    ok += 1;
                    assert_eq!(res.types.len(), outs);
                    assert_eq!(res.syms.len(), outs);
                    for t in &res.types {
                        assert!(t.dims.iter().all(|d| d.as_known().is_none_or(|v| v >= 0)));
                    }
                }
                Ok(Err(e)) => assert!(!e.is_empty()),
                Err(_) => panic!(
                    "{} panicked with {} results on {:?}",
                    op.name(),
                    outs,
                    ins.iter()
                        .map(|i| i.map(|i| (i.ty.to_string(), i.sym.clone())))
                        .collect::<Vec<_>>()
                ),
            }
        }
    }
    // The generator must reach successful inference too, not only errors.
    assert!(ok > 1000, "only {ok} successful inferences");
}
