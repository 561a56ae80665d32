{
  "variables": {
    "cuda_include%": "<!(node -p \"process.env.CUDA_PATH ? process.env.CUDA_PATH + '/include' : '/usr/local/cuda/include'\")"
  },
  "conditions": [
    ["target_arch=='x64'", {
      "targets": [
        {
          "target_name": "vsnap_hash_avx2",
          "type": "static_library",
          "sources": ["native/hash/checksum_avx2.cc"],
          "include_dirs": ["native"],
          "cflags_cc": ["-std=c++17", "-O3", "-fPIC", "-mavx2"]
        },
        {
          "target_name": "vsnap_hash_avx512",
          "type": "static_library",
          "sources": ["native/hash/checksum_avx512.cc"],
          "include_dirs": ["native"],
          "cflags_cc": ["-std=c++17", "-O3", "-fPIC", "-mavx512f", "-mavx512bw", "-Wno-maybe-uninitialized", "-Wno-uninitialized"]
        }
      ]
    }]
  ],
  "targets": [
    {
      "target_name": "vsnap",
      "conditions": [
        ["target_arch=='x64'", {"dependencies": ["vsnap_hash_avx2", "vsnap_hash_avx512"]}]
      ],
      "sources": [
        "native/addon.cc",
        "native/common/error.cc",
        "native/common/fault.cc",
        "native/cuda/driver.cc",
        "native/cuda/context.cc",
        "native/cuda/devices.cc",
        "native/cuda/vmm.cc",
        "native/cuda/vmm_timing.cc",
        "native/cuda/vmm_batch.cc",
        "native/cuda/vmm_alloc_set.cc",
        "native/cuda/stream.cc",
        "native/cuda/checkpoint.cc",
        "native/hash/checksum.cc",
        "native/hash/checksum_base.cc",
        "native/io/files.cc",
        "native/ipc/fd_channel.cc",
        "native/ipc/json_syntax.cc",
        "native/ipc/wire.cc",
        "native/transfer/staging_pool.cc",
        "native/transfer/region.cc",
        "native/transfer/engine.cc",
        "native/transfer/host_buffer.cc",
        "native/transfer/region_set.cc",
        "native/transfer/region_batch.cc",
        "native/transfer/region_pipeline.cc",
        "native/transfer/copy_queue.cc",
        "native/js/js_util.cc",
        "native/js/js_lifecycle.cc",
        "native/js/js_cuda.cc",
        "native/js/js_allocation.cc",
        "native/js/js_staging_pool.cc",
        "native/js/js_host_buffer.cc",
        "native/js/js_held_handles.cc",
        "native/js/js_transfer.cc",
        "native/js/js_memory.cc",
        "native/js/js_copy_queue.cc",
        "native/js/js_region_set.cc",
        "native/js/js_fd_listener.cc",
        "native/js/js_files.cc",
        "native/digest/digest.cc",
        "native/js/js_digest.cc",
        "native/codec/codec.cc",
        "native/codec/codec_gpu.cc",
        "native/codec/codec_capture.cc",
        "native/codec/codec_restore.cc",
        "native/js/js_codec.cc",
        "native/js/js_checkpoint.cc",
        "native/cuda/peer.cc",
        "native/transfer/multipath.cc",
        "native/transfer/multipath_cuda.cc",
        "native/js/js_peer.cc",
        "native/js/js_multipath.cc"
      ],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "native",
        "<(cuda_include)"
      ],
      "defines": ["NAPI_VERSION=8", "NODE_ADDON_API_DISABLE_DEPRECATED", "NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti"],
      "cflags_cc": ["-std=c++17", "-O2", "-ffunction-sections", "-fdata-sections", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"],
      "ldflags": ["-Wl,--as-needed", "-Wl,--gc-sections"],
      "libraries": ["-ldl", "-lpthread"]
    }
  ]
}
