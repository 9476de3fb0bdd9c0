//! Results coming back from a device: [`Readback`], a future of a backend's `read`, `argmax` or
//! `top_k` result.
//!
//! Why a future: in the browser the GPU's answer arrives through the event loop, which must
//! not be blocked, so the same backend code that waits natively has to be awaitable there.
//! Native callers block with [`Readback::wait`]; the CPU backend's results are ready at once.
//! A pending result is boxed behind [`Pending`], which the device layers implement.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::backend::error::BackendError;

/// `Send` where the target has threads (native, and wasm's threaded build, which has no GPU
/// backend); nothing in wasm's single-threaded build, whose GPU handles are not `Send`.
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
pub trait MaybeSend: Send {}
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
impl<T: Send> MaybeSend for T {}
/// `Send` where the target has threads (native, and wasm's threaded build, which has no GPU
/// backend); nothing in wasm's single-threaded build, whose GPU handles are not `Send`.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
pub trait MaybeSend {}
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
impl<T> MaybeSend for T {}

/// A result a device layer is still producing.
pub trait Pending<T>: MaybeSend {
    /// The result if it has arrived; otherwise arrange for `cx` to be woken when it does.
    fn poll_result(&mut self, cx: &mut Context<'_>) -> Poll<Result<T, BackendError>>;

    /// Block until the result arrives (native targets; the device is polled while waiting).
    #[cfg(not(target_arch = "wasm32"))]
    fn wait(&mut self) -> Result<T, BackendError>;
}

/// A result of a device: ready, or pending on the device.
pub struct Readback<T> {
    state: State<T>,
}

enum State<T> {
    Ready(Option<Result<T, BackendError>>),
    Pending(Box<dyn Pending<T>>),
}

impl<T> std::fmt::Debug for Readback<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Ready(_) => "ready",
            State::Pending(_) => "pending",
        };
        f.debug_struct("Readback").field("state", &state).finish()
    }
}

impl<T: MaybeSend + 'static> Readback<T> {
    /// A result that is already there.
    pub fn ready(value: T) -> Self {
        Readback {
            state: State::Ready(Some(Ok(value))),
        }
    }

    /// A result a device layer delivers later.
    pub fn pending(p: impl Pending<T> + 'static) -> Self {
        Readback {
            state: State::Pending(Box::new(p)),
        }
    }

    /// Block until the result is there (native callers).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait(self) -> Result<T, BackendError> {
        match self.state {
            State::Ready(r) => r.unwrap_or_else(|| Err(taken())),
            State::Pending(mut p) => p.wait(),
        }
    }

    /// The result transformed by `f` once it is there.
    pub fn map<U: MaybeSend + 'static>(self, f: impl FnOnce(T) -> U + MaybeSend + 'static) -> Readback<U> {
        match self.state {
            State::Ready(r) => Readback {
                state: State::Ready(r.map(|r| r.map(f))),
            },
            State::Pending(p) => Readback::pending(Map { inner: p, f: Some(f) }),
        }
    }

    /// All of `parts`' results, in order, once every one is there (the first error wins).
    pub fn join(parts: Vec<Readback<T>>) -> Readback<Vec<T>> {
        if parts.iter().all(|p| matches!(p.state, State::Ready(_))) {
            let all: Result<Vec<T>, BackendError> = parts
                .into_iter()
                .map(|p| match p.state {
                    State::Ready(r) => r.unwrap_or_else(|| Err(taken())),
                    State::Pending(_) => unreachable!("checked above"),
                })
                .collect();
            return Readback {
                state: State::Ready(Some(all)),
            };
        }
        Readback::pending(Join {
            parts: parts.into_iter().map(|p| (p, None)).collect(),
        })
    }
}

/// Polled again after it returned its result.
fn taken() -> BackendError {
    BackendError::Device {
        op: "readback",
        problem: "the result was already taken".into(),
    }
}

impl<T: Unpin> Future for Readback<T> {
    type Output = Result<T, BackendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.state {
            State::Ready(r) => Poll::Ready(r.take().unwrap_or_else(|| Err(taken()))),
            State::Pending(p) => p.poll_result(cx),
        }
    }
}

/// [`Readback::map`] of a pending result.
struct Map<T, F> {
    inner: Box<dyn Pending<T>>,
    f: Option<F>,
}

impl<T, U, F: FnOnce(T) -> U + MaybeSend> Pending<U> for Map<T, F> {
    fn poll_result(&mut self, cx: &mut Context<'_>) -> Poll<Result<U, BackendError>> {
        match self.inner.poll_result(cx) {
            Poll::Ready(r) => Poll::Ready(self.apply(r)),
            Poll::Pending => Poll::Pending,
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn wait(&mut self) -> Result<U, BackendError> {
        let r = self.inner.wait();
        self.apply(r)
    }
}

impl<T, U, F: FnOnce(T) -> U> Map<T, F> {
    fn apply(&mut self, r: Result<T, BackendError>) -> Result<U, BackendError> {
        let f = self.f.take().ok_or_else(taken)?;
        r.map(f)
    }
}

/// [`Readback::join`] with some parts pending; each part's result is kept as it arrives.
struct Join<T> {
    parts: Vec<(Readback<T>, Option<T>)>,
}

impl<T: MaybeSend + 'static> Pending<Vec<T>> for Join<T> {
    fn poll_result(&mut self, cx: &mut Context<'_>) -> Poll<Result<Vec<T>, BackendError>> {
        let mut waiting = false;
        for (part, done) in &mut self.parts {
            if done.is_some() {
                continue;
            }
            let polled = match &mut part.state {
                State::Ready(r) => Poll::Ready(r.take().unwrap_or_else(|| Err(taken()))),
                State::Pending(p) => p.poll_result(cx),
            };
            match polled {
                Poll::Ready(Ok(v)) => *done = Some(v),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => waiting = true,
            }
        }
        if waiting {
            return Poll::Pending;
        }
        Poll::Ready(self.parts.iter_mut().map(|(_, d)| d.take().ok_or_else(taken)).collect())
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn wait(&mut self) -> Result<Vec<T>, BackendError> {
        let mut out = Vec::with_capacity(self.parts.len());
        for (part, done) in &mut self.parts {
            let v = match done.take() {
                Some(v) => v,
                None => match &mut part.state {
                    State::Ready(r) => r.take().unwrap_or_else(|| Err(taken()))?,
                    State::Pending(p) => p.wait()?,
                },
            };
            out.push(v);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Ready after `polls` polls; counts how often it was polled.
    struct Slow {
        polls: usize,
        seen: Arc<AtomicUsize>,
        value: u32,
    }

    impl Pending<u32> for Slow {
        fn poll_result(&mut self, cx: &mut Context<'_>) -> Poll<Result<u32, BackendError>> {
            let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
            if n >= self.polls {
                Poll::Ready(Ok(self.value))
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }

        #[cfg(not(target_arch = "wasm32"))]
        fn wait(&mut self) -> Result<u32, BackendError> {
            Ok(self.value)
        }
    }

    #[test]
    fn map_and_join_keep_order_whether_ready_or_pending() {
        let seen = Arc::new(AtomicUsize::new(0));
        let slow = |v, polls| {
            Readback::pending(Slow {
                polls,
                seen: seen.clone(),
                value: v,
            })
        };
        let parts = vec![Readback::ready(1u32), slow(2, 3), Readback::ready(3).map(|x| x * 10)];
        let joined = Readback::join(parts).map(|v| v.iter().sum::<u32>());
        assert_eq!(pollster::block_on(joined).unwrap(), 33);
        assert!(seen.load(Ordering::Relaxed) >= 3);
        let waited = Readback::join(vec![slow(4, 100), Readback::ready(5)]).wait().unwrap();
        assert_eq!(waited, vec![4, 5]);
        let all_ready = Readback::join(vec![Readback::ready(6u32), Readback::ready(7)]);
        assert!(matches!(all_ready.state, State::Ready(_)));
        assert_eq!(all_ready.wait().unwrap(), vec![6, 7]);
    }
}
