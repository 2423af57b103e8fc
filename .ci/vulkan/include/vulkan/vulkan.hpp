// localspec's compatibility shim for building llama.cpp's Vulkan backend against Vulkan-Headers
// older than 1.3.272 (Debian 12 ships 1.3.239). ggml-vulkan.cpp names VK_EXT_layer_settings'
// three types, which first appear in 1.3.272; it only passes them to vkCreateInstance when the
// loader reports the extension, so declaring them with the registry's layout is all it needs.
// .ci/vulkan.sh puts this directory on CPLUS_INCLUDE_PATH; with newer headers it adds nothing.
#pragma once
#include_next <vulkan/vulkan.hpp>

#if VK_HEADER_VERSION < 272
#include <cstdint>
namespace vk {
// Values and layouts as in the Vulkan registry (VK_EXT_layer_settings, revision 2).
enum class LayerSettingTypeEXT : int32_t {
    eBool32 = 0, eInt32 = 1, eInt64 = 2, eUint32 = 3, eUint64 = 4, eFloat32 = 5, eFloat64 = 6, eString = 7,
};
struct LayerSettingEXT {
    const char* pLayerName;
    const char* pSettingName;
    LayerSettingTypeEXT type;
    uint32_t valueCount;
    const void* pValues;
};
struct LayerSettingsCreateInfoEXT {
    // VK_STRUCTURE_TYPE_LAYER_SETTINGS_CREATE_INFO_EXT
    int32_t sType = 1000496000;
    const void* pNext = nullptr;
    uint32_t settingCount = 0;
    const LayerSettingEXT* pSettings = nullptr;
    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT>& settings)
        : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
};
}  // namespace vk
#endif
