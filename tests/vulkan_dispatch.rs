//! The Vulkan backend's memory and dispatch layers on a real driver (Mesa lavapipe in CI):
//! the shared GPU layer's dispatches recorded through ash compute what the same kernels
//! compute through wgpu, bit for bit, and what the CPU's scalar rules say; one pass is one
//! submission; memory the host cannot see goes through staging buffers (forced on lavapipe,
//! whose memory the host sees); freed ranges are reused. Without a Vulkan device these tests
//! skip (`common::device_or_skip`; with `TINYLLM_REQUIRE_GPU=1` they fail instead).

mod common;
#[path = "common/rounding.rs"]
mod rounding;

use std::sync::Arc;

use tinyllm::backend::gpu::plan::{self, MatShape, PartRows};
use tinyllm::backend::gpu::{MatmulVariant, Strategy};
use tinyllm::backend::vulkan::ash::vk;
use tinyllm::backend::vulkan::dispatch::{Pipelines, Recorder};
use tinyllm::backend::vulkan::memory::{Buffer, Location, Memory};
use tinyllm::backend::vulkan::Device;
use tinyllm::quant::GgmlType;

use common::rng::Rng;

fn device_or_skip() -> Option<Arc<Device>> {
    common::device_or_skip(|| Device::open(None)).map(Arc::new)
}

const USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw(),
);

fn upload(mem: &Memory, rec: &mut Recorder, data: &[u8]) -> Buffer {
    let b = mem.alloc(data.len() as u64, USAGE, Location::Device).expect("alloc");
    rec.upload(&b, 0, data).expect("upload");
    b
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Activations with the cases the rounding rules single out: a zero block, a block whose
/// largest magnitude is negative, and values exactly halfway between two steps (ties go to
/// even in ggml's x86 rules).
fn activations(rng: &mut Rng, blocks_of_256: usize) -> Vec<f32> {
    let mut x = rng.vec(256 * blocks_of_256, 3.0);
    x[..256].fill(0.0);
    x[256] = -7.5;
    // amax 127 makes the Q8_0 step 1: 0.5, 1.5, 2.5 are ties.
    x[512] = 127.0;
    for (i, v) in x[513..544].iter_mut().enumerate() {
        *v = i as f32 * 0.5 - 7.5;
    }
    x
}

#[test]
fn quantize_act_rounds_as_the_cpu_bit_for_bit_with_and_without_staging() {
    let Some(dev) = device_or_skip() else { return };
    for staging in [false, true] {
        let mem = Arc::new(Memory::new(&dev).force_staging(staging));
        let mut rec = Recorder::new(&mem).expect("recorder");
        let mut pipes = Pipelines::new(&dev);
        let x = activations(&mut Rng(0x5eed), 6);
        let xb = upload(&mem, &mut rec, bytemuck::cast_slice(&x));
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::F16, GgmlType::BF16] {
            let before = rec.stats();
            let yb = mem.alloc((x.len() * 4) as u64, USAGE, Location::Device).expect("alloc");
            let d = plan::quantize_act(ty, x.len()).expect("plan").expect("a rounding");
            rec.dispatch(&mut pipes, &d, &[(1, &xb), (2, &yb)]).expect("dispatch");
            let got = floats(&rec.read(&yb, 0, x.len() * 4).expect("read"));
            let want = rounding::rounded_activations(ty, &x);
            let wrong: Vec<usize> = (0..x.len())
                .filter(|&i| got[i].to_bits() != want[i].to_bits())
                .collect();
            assert!(
                wrong.is_empty(),
                "{ty} (staging {staging}): {} of {} values differ, first at {}: {} vs {} (x {})",
                wrong.len(),
                x.len(),
                wrong[0],
                got[wrong[0]],
                want[wrong[0]],
                x[wrong[0]]
            );
            let after = rec.stats();
            assert_eq!(after.submissions - before.submissions, 1, "one pass, one submission");
            assert_eq!(
                after.staged_bytes > before.staged_bytes,
                staging,
                "staging only where forced"
            );
            mem.free(yb);
        }
        mem.free(xb);
    }
}

/// Rows-variant matmuls of the llama fixture's weights (every format it stores) through ash
/// equal the same dispatches through wgpu, bit for bit, for several activation row counts,
/// in one pass and one submission each.
#[test]
fn rows_matmuls_equal_webgpus_bit_for_bit() {
    use tinyllm::backend::webgpu::{WebGpuBackend, WebGpuOptions};
    use tinyllm::backend::Backend;
    let Some(dev) = device_or_skip() else { return };
    let Some(g) = common::device_or_skip(|| {
        WebGpuBackend::with_options(WebGpuOptions {
            matmul: Some(MatmulVariant::Rows),
            ..Default::default()
        })
    }) else {
        return;
    };
    let mem = Arc::new(Memory::new(&dev));
    let mut rec = Recorder::new(&mem).expect("recorder");
    let mut pipes = Pipelines::new(&dev);
    let st = Strategy {
        matmul: MatmulVariant::Rows,
        tex_subgroups: false,
        reduce_subgroups: false,
        f16_matmul: false,
        kv_chunk: None,
        split_any_rows: false,
        max_storage: u64::from(u32::MAX),
    };
    let mut rng = Rng(0xfeed);
    let mut seen = Vec::new();
    for quant in ["F16", "Q8_0", "Q4_K_M", "Q4_0", "Q5_0", "Q6_K", "IQ4_XS"] {
        let path = common::golden(&format!("fixtures/llama.{quant}.gguf"));
        let file = std::sync::Arc::new(tinyllm::gguf::GgufFile::open(&path).expect("fixture"));
        let names: Vec<String> = file
            .tensors()
            .iter()
            .filter(|t| t.shape.len() == 2 && t.name.starts_with("blk.0.") && !seen.contains(&t.ty))
            .map(|t| t.name.clone())
            .collect();
        for name in names {
            let t = file.tensor(&name).expect("tensor");
            let (ty, n_in, n_out) = (t.info.ty, t.info.shape[0] as usize, t.info.shape[1] as usize);
            seen.push(ty);
            let wb = upload(&mem, &mut rec, t.data);
            let w = g.load_weight(&file, &name).expect("webgpu weight");
            for rows in [1usize, 3, 9] {
                let x = rng.vec(rows * n_in, 1.0);
                let xb = upload(&mem, &mut rec, bytemuck::cast_slice(&x));
                let yb = mem
                    .alloc((rows * n_out * 4) as u64, USAGE, Location::Device)
                    .expect("alloc");
                let xq = mem
                    .alloc((rows * n_in * 4) as u64, USAGE, Location::Device)
                    .expect("alloc");
                let before = rec.stats();
                let input = match plan::quantize_act(ty, rows * n_in).expect("plan") {
                    Some(d) => {
                        rec.dispatch(&mut pipes, &d, &[(1, &xb), (2, &xq)]).expect("round");
                        &xq
                    }
                    None => &xb,
                };
                let m = MatShape { ty, n_in, n_out };
                let part = PartRows { row0: 0, rows: n_out };
                let row_bytes = t.data.len() / n_out;
                let d = plan::matmul(&st, m, part, rows, row_bytes).expect("plan");
                rec.dispatch(&mut pipes, &d, &[(1, &wb), (2, input), (3, &yb)])
                    .expect("matmul");
                let ours = floats(&rec.read(&yb, 0, rows * n_out * 4).expect("read"));
                assert_eq!(rec.stats().submissions - before.submissions, 1);
                let mut xg = g.alloc(x.len()).expect("alloc");
                g.write(&mut xg, &x).expect("write");
                let mut yg = g.alloc(rows * n_out).expect("alloc");
                g.matmul(&w, &xg, rows, &mut yg).expect("webgpu matmul");
                let theirs = g.read(&yg, rows * n_out).expect("read").wait().expect("readback");
                println!("[vulkan] matmul {name} ({ty}) {n_out}x{n_in}, {rows} rows");
                assert_eq!(
                    bits(&ours),
                    bits(&theirs),
                    "{name} ({ty}) with {rows} rows: ash and wgpu differ"
                );
                for b in [xb, yb, xq] {
                    mem.free(b);
                }
            }
            mem.free(wb);
        }
    }
    assert!(seen.len() >= 6, "formats covered: {seen:?}");
}

/// Buffers take ranges of shared blocks, a freed range is reused, an emptied block goes back,
/// and a buffer larger than a block gets one of its own.
#[test]
fn buffers_share_blocks_and_give_them_back() {
    let Some(dev) = device_or_skip() else { return };
    let block = 1 << 20;
    let mem = Arc::new(Memory::with_block_bytes(&dev, block));
    let a = mem.alloc(1000, USAGE, Location::Device).expect("a");
    let b = mem.alloc(1000, USAGE, Location::Device).expect("b");
    assert_eq!(mem.stats().blocks, 1, "two small buffers share a block");
    mem.free(a);
    let c = mem.alloc(500, USAGE, Location::Device).expect("c");
    assert_eq!(mem.stats().blocks, 1, "the freed range is reused");
    let big = mem.alloc(3 * block, USAGE, Location::Device).expect("big");
    let s = mem.stats();
    assert_eq!(s.blocks, 2, "a buffer larger than a block gets its own");
    assert!(s.allocated >= block + 3 * block);
    mem.free(big);
    assert_eq!(mem.stats().blocks, 1, "an emptied block goes back to the driver");
    mem.free(b);
    mem.free(c);
    assert_eq!(mem.stats(), Default::default());
    // Data survives a round trip through a device buffer the host cannot see.
    let mem = Arc::new(Memory::with_block_bytes(&dev, block).force_staging(true));
    let mut rec = Recorder::new(&mem).expect("recorder");
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let buf = upload(&mem, &mut rec, &data);
    assert!(buf.mapped().is_none());
    assert_eq!(rec.read(&buf, 100, 3000).expect("read"), data[100..3100].to_vec());
    assert_eq!(rec.stats().submissions, 1, "upload and readback in one submission");
    mem.free(buf);
}

/// A sample of kernel variants for the cache tests: plain kernels and one format's matmuls.
fn some_kernels() -> Vec<tinyllm::backend::gpu::Kernel> {
    use tinyllm::backend::gpu::Kernel;
    vec![
        Kernel::Add,
        Kernel::Swiglu,
        Kernel::RmsNorm,
        Kernel::Rope,
        Kernel::QuantizeAct,
        Kernel::Argmax,
        Kernel::Route,
        Kernel::MoeCombine,
        Kernel::MatmulRows(GgmlType::Q4_K),
        Kernel::Embed(GgmlType::Q4_K),
    ]
}

/// The pipeline cache: a cold start writes its file (named by device and driver, with the
/// header Vulkan defines), the next start is seeded from it; a file made for another device or
/// garbage is ignored (a cold start, no error); a cache that cannot be written is an error
/// naming the path.
#[test]
fn pipeline_cache_is_saved_and_seeds_the_next_start() {
    use tinyllm::backend::vulkan::cache::{file_name, header_matches, PipelineCache};
    let Some(dev) = device_or_skip() else { return };
    let dir = std::env::temp_dir().join(format!("tinyllm-pipelines-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let kernels = some_kernels();
    let cold = PipelineCache::open(&dev, Some(&dir)).expect("open");
    assert_eq!(cold.loaded(), 0, "no file yet");
    let mut pipes = Pipelines::with_cache(&dev, Some(cold));
    pipes.prepare(&kernels).expect("prepare");
    assert_eq!(pipes.len(), kernels.len());
    let written = pipes.cache().expect("cache").save().expect("save");
    let file = dir.join(file_name(dev.info()));
    let data = std::fs::read(&file).expect("the cache file");
    assert_eq!(data.len(), written);
    assert!(
        header_matches(&data, dev.info()),
        "the file starts with this device's header"
    );
    drop(pipes);
    let warm = PipelineCache::open(&dev, Some(&dir)).expect("open");
    assert_eq!(warm.loaded(), written, "the next start is seeded from the file");
    let mut pipes = Pipelines::with_cache(&dev, Some(warm));
    pipes.prepare(&kernels).expect("prepare from the cache");
    drop(pipes);
    // Another device's header, then garbage: ignored.
    let mut foreign = data.clone();
    foreign[16] ^= 0xff;
    for bad in [foreign, b"not a pipeline cache".to_vec()] {
        std::fs::write(&file, &bad).expect("write");
        let c = PipelineCache::open(&dev, Some(&dir)).expect("a bad file is not an error");
        assert_eq!(c.loaded(), 0);
    }
    // A directory path that is a file: saving fails and says where.
    let blocked = dir.join("blocked");
    std::fs::write(&blocked, b"x").expect("write");
    let c = PipelineCache::open(&dev, Some(&blocked)).expect("open");
    let err = c.save().expect_err("cannot save under a file").to_string();
    assert!(err.contains("blocked"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Startup with and without the pipeline cache (a measurement, not a test): every kernel
/// variant's pipeline made cold (empty cache), then warm (seeded from the file the cold start
/// saved). `cargo test --release --test vulkan_dispatch -- --ignored --nocapture`.
#[test]
#[ignore = "measurement: run with --ignored --nocapture"]
fn measure_pipeline_startup_cold_and_warm() {
    use tinyllm::backend::gpu::kernels;
    use tinyllm::backend::vulkan::cache::PipelineCache;
    let Some(dev) = device_or_skip() else { return };
    let dir = std::env::temp_dir().join(format!("tinyllm-pipelines-measure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let all = kernels::all_variants();
    let mut times = Vec::new();
    for run in ["cold", "warm"] {
        let t = std::time::Instant::now();
        let cache = PipelineCache::open(&dev, Some(&dir)).expect("open");
        let loaded = cache.loaded();
        let mut pipes = Pipelines::with_cache(&dev, Some(cache));
        pipes.prepare(&all).expect("prepare");
        let secs = t.elapsed().as_secs_f64();
        let saved = pipes.cache().expect("cache").save().expect("save");
        println!(
            "[vulkan] {run} start: {} pipelines in {secs:.2} s (cache read {loaded} bytes, saved {saved})",
            pipes.len()
        );
        times.push(secs);
    }
    println!("[vulkan] warm start {:.1}x faster than cold", times[0] / times[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With profiling on, every dispatch is timed and the profile adds them up per kernel: the
/// calls counted, and a kernel over a million values taking measurable device time.
#[test]
fn profile_times_each_kernel() {
    use tinyllm::backend::gpu::Kernel;
    let Some(dev) = device_or_skip() else { return };
    if dev.info().timestamp_valid_bits == 0 {
        common::skip(&format_args!("no timestamps on {}", dev.info().name));
        return;
    }
    let mem = Arc::new(Memory::new(&dev));
    let mut rec = Recorder::new(&mem).expect("recorder");
    let mut pipes = Pipelines::new(&dev);
    rec.enable_profile().expect("profile");
    let n = 1 << 20;
    let x = Rng(3).vec(n, 2.0);
    let xb = upload(&mem, &mut rec, bytemuck::cast_slice(&x));
    let yb = mem.alloc((n * 4) as u64, USAGE, Location::Device).expect("alloc");
    let round = plan::quantize_act(GgmlType::Q4_K, n)
        .expect("plan")
        .expect("a rounding");
    let add = plan::elementwise("add", Kernel::Add, n, 0, 0.0)
        .expect("plan")
        .expect("work");
    for _ in 0..2 {
        rec.dispatch(&mut pipes, &round, &[(1, &xb), (2, &yb)])
            .expect("dispatch");
    }
    rec.dispatch(&mut pipes, &add, &[(1, &yb), (2, &xb)]).expect("dispatch");
    rec.submit().expect("submit");
    let profile = rec.profile();
    println!("[vulkan] profile: {profile:?}");
    let calls = |label: &str| profile.iter().find(|k| k.label == label).map(|k| (k.calls, k.ns));
    let (round_calls, round_ns) = calls("quantize_act").expect("quantize_act timed");
    assert_eq!(round_calls, 2);
    assert!(round_ns > 0.0, "a million values take device time");
    assert_eq!(calls("add").map(|c| c.0), Some(1));
    assert_eq!(rec.stats().submissions, 1, "one pass, one submission, timed or not");
    mem.free(xb);
    mem.free(yb);
}
