//! Step order for overlap: CPU work that a GPU step needs early goes first, CPU work it
//! needs later goes after the GPU work it can run beside.
//!
//! The runtime submits consecutive steps of one device as one chunk, and a chunk that
//! another waits on signals only when all of it is done. Lowering orders steps as the
//! graph's nodes come, so a CPU prologue in front of GPU work is one chunk even when its
//! parts feed GPU steps far apart. BERT-base on the H100: the attention-mask arithmetic
//! (about 30 small CPU kernels) sat between the embeddings' layer norm and its copy to the
//! GPU, so the GPU waited for the mask before starting the first layer's projections.
//!
//! [`schedule_for_overlap`] reorders by a priority that respects every dependency: a GPU
//! step keeps its own index as its priority, any other step takes the smallest priority of
//! the steps reading what it writes (the first GPU step that transitively needs it; none:
//! last), ties broken by the original index. A producer never sorts after its consumer: a
//! floating step's priority is at most its consumers', a GPU consumer of a GPU step comes
//! later in the original order, and a floating consumer of a GPU step has a GPU dependent
//! after that step. Programs with no CPU steps keep their order.

use std::collections::HashMap;

use rafter_ir::program::{Program, Step};

/// Reorders `p.steps` (before memory planning: liveness follows the new order) so that
/// each GPU step waits only for the CPU work it needs. `on_gpu(kernel)` says whether a
/// kernel runs on a non-CPU device.
pub fn schedule_for_overlap(p: &mut Program, on_gpu: impl Fn(usize) -> bool) {
    let n = p.steps.len();
    let anchored: Vec<bool> = p
        .steps
        .iter()
        .map(|s| matches!(s, Step::Dispatch { kernel, .. } if on_gpu(*kernel)))
        .collect();
    if anchored.iter().all(|&a| a) || !anchored.contains(&true) {
        return;
    }
    let mut readers: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, step) in p.steps.iter().enumerate() {
        for b in step.reads() {
            readers.entry(b).or_default().push(i);
        }
    }
    // Consumers come after their producers, so one backward pass settles every priority.
    let mut priority = vec![usize::MAX; n];
    for i in (0..n).rev() {
        priority[i] = if anchored[i] {
            i
        } else {
            p.steps[i]
                .writes()
                .iter()
                .flat_map(|b| readers.get(b).into_iter().flatten())
                .filter(|&&c| c > i)
                .map(|&c| priority[c])
                .min()
                .unwrap_or(usize::MAX)
        };
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (priority[i], i));
    let mut old: Vec<Option<Step>> = std::mem::take(&mut p.steps).into_iter().map(Some).collect();
    p.steps = order
        .into_iter()
        .map(|i| old[i].take().expect("each step once"))
        .collect();
}
