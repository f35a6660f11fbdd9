//! Mixture-of-experts routing: which experts a token's router logits choose, and with what
//! weight.

/// The experts `logits` (one per expert) choose: softmax in f32 (max subtracted first, as
/// PyTorch's), the `top_k` largest probabilities (ties to the lower expert index), divided
/// by their sum when `normalize` (Qwen3-MoE's `norm_topk_prob`). `(expert, weight)` pairs,
/// largest first. `top_k` is clamped to the expert count.
pub fn moe_route(logits: &[f32], top_k: usize, normalize: bool) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // A stable sort keeps equal probabilities in index order.
    order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]));
    order.truncate(top_k);
    let chosen: f32 = order.iter().map(|&e| exps[e] / sum).sum();
    order
        .into_iter()
        .map(|e| {
            let p = exps[e] / sum;
            (e, if normalize { p / chosen } else { p })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_largest_and_renormalises() {
        // softmax of ln [1, 3, 3, 2] = [1, 3, 3, 2] / 9.
        let l = [0.0, 3f32.ln(), 3f32.ln(), 2f32.ln()];
        let r = moe_route(&l, 2, false);
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2]);
        assert!((r[0].1 - 3.0 / 9.0).abs() < 1e-6);
        let r = moe_route(&l, 3, true);
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2, 3]);
        let total: f32 = r.iter().map(|p| p.1).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!((r[2].1 - 0.25).abs() < 1e-6);
        assert_eq!(moe_route(&l, 9, false).len(), 4);
    }
}
