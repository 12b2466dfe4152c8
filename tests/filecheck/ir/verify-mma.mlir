// RUN: not tkc opt %s 2>&1 | filecheck %s

// A verifier error names the op in the kernel author's terms and says what to fix.

// CHECK: mma_ABt: K mismatch: A is rt[bf16, 16, 64], so K = 64, but B is rt[bf16, 32, 32], so K = 32
// CHECK-SAME: (mma_ABt computes A·Bᵀ + C with A M×K and Bᵀ K×N)
func.func @bad_mma(%a: !tile.rt<16x64xbf16>, %b: !tile.rt<32x32xbf16>, %c: !tile.rt<16x32xf32>) {
  %d = tile.mma_ABt %a, %b, %c : !tile.rt<16x64xbf16>, !tile.rt<32x32xbf16>, !tile.rt<16x32xf32>
  func.return
}
