//! `HugePageAlloc` as this test binary's global allocator: a large
//! allocation's 2 MB-aligned interior is advised `MADV_HUGEPAGE` (its
//! mapping carries the `hg` flag in `/proc/self/smaps`), the advised
//! mapping starts and ends on 2 MB boundaries inside the allocation, and
//! contents survive growth.

#![allow(clippy::unwrap_used)]

#[global_allocator]
static ALLOC: edgeflow_backends::HugePageAlloc = edgeflow_backends::HugePageAlloc;

const HUGE: usize = 2 << 20;

/// The mapping of `/proc/self/smaps` that holds `addr`: (start, end, flags).
#[cfg(target_os = "linux")]
fn mapping_of(addr: usize) -> Option<(usize, usize, String)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                current = Some((a, b));
                continue;
            }
        }
        if let (Some((a, b)), Some(flags)) = (current, line.strip_prefix("VmFlags:")) {
            if (a..b).contains(&addr) {
                return Some((a, b, flags.trim().to_string()));
            }
        }
    }
    None
}

#[test]
#[cfg(target_os = "linux")]
fn large_allocations_are_advised_on_whole_2mb_regions_and_keep_their_contents() {
    let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists();
    let mut big: Vec<u8> = Vec::with_capacity(9 << 20);
    let p = big.as_ptr() as usize;
    let interior = p.next_multiple_of(HUGE);
    let (a, b, flags) = mapping_of(interior).expect("the allocation is mapped");
    if thp {
        assert!(
            flags.split(' ').any(|f| f == "hg"),
            "interior not advised: {flags}"
        );
        assert!(
            a % HUGE == 0 && b % HUGE == 0,
            "advised mapping {a:#x}-{b:#x} not on 2 MB boundaries"
        );
        assert!(
            a >= p && b <= p + (9 << 20),
            "advice reached outside the allocation"
        );
    } else {
        eprintln!("no transparent huge pages on this kernel: only the contents are checked");
    }
    // Contents survive writing, growth (realloc) and zeroed allocation.
    big.extend((0..9 << 20).map(|i: usize| (i % 251) as u8));
    big.extend((0..8 << 20).map(|i: usize| (i % 241) as u8));
    assert!(big[..9 << 20]
        .iter()
        .enumerate()
        .all(|(i, &v)| v == (i % 251) as u8));
    assert!(big[9 << 20..]
        .iter()
        .enumerate()
        .all(|(i, &v)| v == (i % 241) as u8));
    let zeros = vec![0u32; 3 << 20];
    assert!(zeros.iter().all(|&z| z == 0));
}
