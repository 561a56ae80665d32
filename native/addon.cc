// The vsnap native addon: module registration. Each binding file adds its own exports; the
// TypeScript side types and loads this module in exactly one place (src/native/).
#include <napi.h>

#include "js/js_util.h"

namespace {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  auto* data = new vsnap::js::AddonData();
  env.SetInstanceData(data);
  vsnap::js::installLifecycle(env, data->lifecycle);
  vsnap::js::initCuda(env, exports);
  vsnap::js::initAllocation(env, exports);
  vsnap::js::initStagingPool(env, exports);
  vsnap::js::initHostBuffer(env, exports);
  vsnap::js::initHeldHandles(env, exports);
  vsnap::js::initTransfer(env, exports);
  vsnap::js::initFdListener(env, exports);
  vsnap::js::initFiles(env, exports);
  exports.Set("setFault", Napi::Function::New(env, vsnap::js::SetFault, "setFault"));
  vsnap::js::initDigest(env, exports);
  vsnap::js::initCodec(env, exports);
  vsnap::js::initCheckpoint(env, exports);
  vsnap::js::initPeer(env, exports);
  vsnap::js::initMultipath(env, exports);
  vsnap::js::initRegionSet(env, exports);
  vsnap::js::initCopyQueue(env, exports);
  exports.Set("abiVersion", Napi::Number::New(env, 8));
  return exports;
}

}  // namespace

NODE_API_MODULE(vsnap, Init)
