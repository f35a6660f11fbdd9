//! A compiled decoder's session as [`LogitsModel`]: the generation loop's view of it.

use std::time::Duration;

use rafter_generate::LogitsModel;
use rafter_runtime::{Session, Tensor};

/// How long one call may take before the loop gives up (a 10k-token prefill of a large
/// model on two cores stays well inside it).
const CALL_TIMEOUT: Duration = Duration::from_secs(3600);

/// The decoder session with its KV cache, feeding tokens and returning the last position's
/// logits.
pub struct SessionModel<'a> {
    session: &'a Session,
    context: usize,
    logits: Vec<f32>,
}

impl<'a> SessionModel<'a> {
    /// The model over `session` (a decoder compiled with `Logits::Last`), whose KV cache
    /// holds at most `context` positions.
    pub fn new(session: &'a Session, context: usize) -> SessionModel<'a> {
        SessionModel {
            session,
            context,
            logits: Vec::new(),
        }
    }
}

impl LogitsModel for SessionModel<'_> {
    fn forward(
        &mut self,
        tokens: &[u32],
    ) -> Result<&[f32], Box<dyn std::error::Error + Send + Sync>> {
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let input = Tensor::from_slice(&[1, ids.len()], &ids)?;
        let out = self.session.run(vec![input], CALL_TIMEOUT)?;
        let logits = out
            .first()
            .ok_or("the decoder returned no logits")?
            .as_slice::<f32>()?;
        // `Logits::Last`: one row; with every position, the last row.
        let vocab = *out[0].shape().last().unwrap_or(&0);
        let last = &logits[logits.len().saturating_sub(vocab)..];
        self.logits.clear();
        self.logits.extend_from_slice(last);
        if tokens.len() > 1 {
            // A prefill's temporaries (quantized activations, per-call views) are freed by
            // now but stay resident in the allocator's heap for the rest of the run; decode
            // steps allocate far less. One trim per prefill (not per decode step: a trim
            // walks the heap) hands those pages back.
            crate::release_freed_heap();
        }
        Ok(&self.logits)
    }

    fn reset(&mut self) {
        // A reset waits for the last call; if that timed out the next call reports it.
        let _ = self.session.reset_state(CALL_TIMEOUT);
    }

    fn max_context(&self) -> usize {
        self.context
    }
}
