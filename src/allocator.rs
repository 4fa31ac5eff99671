//! The process's allocator: mimalloc, asked the way its own fast path wants.
//!
//! The `mimalloc` crate's `GlobalAlloc` passes every allocation to `mi_malloc_aligned`, even with
//! the word alignment that every mimalloc block has anyway. That path costs more on each call and,
//! above 1 KiB, for sizes that are not a power of two (a 1,460-byte write buffer, a request's
//! boxed future), mimalloc cannot tell that a plain block is aligned enough and over-allocates
//! to align it. Here an alignment of at most a word goes to `mi_malloc`, `mi_zalloc` and
//! `mi_realloc`, which always return word-aligned blocks (mimalloc's size classes are whole
//! words); larger alignments still go to the aligned calls.

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// Every mimalloc block is aligned to at least a machine word.
const PLAIN_ALIGNMENT: usize = std::mem::size_of::<usize>();

/// mimalloc as the global allocator; see the module's doc.
pub struct Mimalloc;

fn plain(layout: &Layout) -> bool {
    layout.align() <= PLAIN_ALIGNMENT
}

// SAFETY: every pointer handed out comes from mimalloc with at least the layout's size and
// alignment (plain blocks are word-aligned, larger alignments are asked for), and is given back
// to mimalloc; `mi_free` takes blocks from either call.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain(&layout) {
            mi_malloc(layout.size()) as *mut u8
        } else {
            mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain(&layout) {
            mi_zalloc(layout.size()) as *mut u8
        } else {
            mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi_free(ptr as *mut c_void);
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if plain(&layout) {
            mi_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_has_its_layouts_alignment_and_keeps_its_bytes_when_grown() {
        let sizes = [1, 7, 8, 24, 40, 1000, 1460, 7000, 70_000];
        let aligns = [1, 2, 4, 8, 16, 64, 128, 4096];
        for size in sizes {
            for align in aligns {
                let layout = Layout::from_size_align(size, align).unwrap();
                unsafe {
                    let block = Mimalloc.alloc(layout);
                    assert!(!block.is_null());
                    assert_eq!(block as usize % align, 0, "size {size}, align {align}");
                    block.write_bytes(0xA5, size);
                    let grown = Mimalloc.realloc(block, layout, size * 3);
                    assert_eq!(grown as usize % align, 0, "grown {size}, align {align}");
                    let kept = std::slice::from_raw_parts(grown, size);
                    assert!(
                        kept.iter().all(|&b| b == 0xA5),
                        "size {size}, align {align}"
                    );
                    Mimalloc.dealloc(grown, Layout::from_size_align(size * 3, align).unwrap());

                    let zeroed = Mimalloc.alloc_zeroed(layout);
                    assert_eq!(zeroed as usize % align, 0);
                    assert!(std::slice::from_raw_parts(zeroed, size)
                        .iter()
                        .all(|&b| b == 0));
                    Mimalloc.dealloc(zeroed, layout);
                }
            }
        }
    }
}
