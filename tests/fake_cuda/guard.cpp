// The fake CUDA device guard of tests/fake_cuda.py: c10's DeviceGuardImplInterface for DeviceType::CUDA,
// registered only where none is (a CPU build of torch); the current device is a thread-local.
#include <c10/core/impl/DeviceGuardImplInterface.h>
namespace {
using namespace c10;
thread_local DeviceIndex current = 0;
DeviceIndex devices = 1;
Device cuda(DeviceIndex index) { return Device(DeviceType::CUDA, index < 0 ? current : index); }
struct FakeCudaGuard final : impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::CUDA; }
  Device exchangeDevice(Device d) const override { Device old = cuda(current); if (d.index() >= 0) current = d.index(); return old; }
  Device getDevice() const override { return cuda(current); }
  void setDevice(Device d) const override { if (d.index() >= 0) current = d.index(); }
  void uncheckedSetDevice(Device d) const noexcept override { if (d.index() >= 0) current = d.index(); }
  Stream getStream(Device d) const override { return Stream(Stream::DEFAULT, cuda(d.index())); }
  Stream getDefaultStream(Device d) const override { return getStream(d); }
  Stream exchangeStream(Stream s) const override { return getStream(s.device()); }
  DeviceIndex deviceCount() const noexcept override { return devices; }
};
const FakeCudaGuard* guard = nullptr;
}
extern "C" int fake_cuda_register(int count) {
  devices = static_cast<DeviceIndex>(count);
  if (impl::hasDeviceGuardImpl(DeviceType::CUDA)) return impl::getDeviceGuardImpl(DeviceType::CUDA) == guard;
  if (guard == nullptr) guard = new FakeCudaGuard();
  impl::registerDeviceGuard(DeviceType::CUDA, guard);
  return 1;
}
extern "C" void fake_cuda_unregister() {
  if (guard != nullptr && impl::hasDeviceGuardImpl(DeviceType::CUDA)) impl::registerDeviceGuard(DeviceType::CUDA, nullptr);
}
extern "C" int fake_cuda_current() { return current; }
extern "C" void fake_cuda_set(int index) { current = static_cast<DeviceIndex>(index); }
